"""Labels added to the dense head (`add_labels(head=True)`) leave every existing logit bit-identical on random
inputs, whatever the head's size (a matmul's sums depend on its shape: 14 rows grown to 15 changed them by up to
4.8e-7); `head` takes True or False only ("no" is truthy, and put the labels in the head)."""

import pytest
import torch
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.labels.additions import (
    NewLabelWeights,
    default_placement_is_head,
    extended_output_layer,
    place_new_labels,
)
from haste_hf.modeling.output_layer import HEAD_LOGIT_ROWS, HasteOutputLayer


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "features, labels, head, added, fields",
    [
        (32, 30, 1, 7, {}),
        (64, 100, 10, 17, {}),
        (384, 452, 14, 5, {}),
        (48, 60, 6, 9, {"head_projection_dim": 40}),
        (32, 2 * HEAD_LOGIT_ROWS + 40, HEAD_LOGIT_ROWS - 3, 9, {}),  # across a block of head rows
    ],
)
def test_head_labels_leave_the_existing_logits_bit_identical(seed, features, labels, head, added, fields):
    torch.manual_seed(seed)
    layer = HasteOutputLayer(features, labels, head, 4, 8, **fields).eval()
    with torch.no_grad():
        layer.head.bias.normal_()
    x = torch.randn(200, features)
    before = layer.logits(x)
    weights = NewLabelWeights(layer, place_new_labels(layer, added, None, seed), added)
    with torch.no_grad():
        weights.head_weight.normal_()
        weights.head_bias.normal_()
    extended = extended_output_layer(layer, weights)
    after = extended.logits(x)
    assert extended.head_label_count == head + added
    assert torch.equal(after[:, :labels], before)
    # The new rows score as a plain matmul does (float32 sums of up to 384 terms of ~1).
    head_x = layer.branch_inputs(x)[0]
    expected = head_x @ weights.head_weight.T + weights.head_bias
    torch.testing.assert_close(after[:, labels:], expected, atol=2e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_a_model_takes_head_labels_with_its_logits_bit_identical(tokenizer):
    model = make_tiny_model(label_count=30, head_label_count=14, group_size=4, fan_in=8, training=False)
    texts = [" ".join(f"w{(7 * i + j) % 90}" for j in range(6)) for i in range(64)]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        before = model(**batch).logits
    model.add_labels(["w60 w61", "w62 w63"], negatives=texts[:20], tokenizer=tokenizer, head=True)
    with torch.no_grad():
        assert torch.equal(model(**batch).logits[:, :30], before)


@pytest.mark.parametrize("head", ["no", "False", 1, 0, 1.0])
def test_head_must_be_a_bool(tokenizer, head):
    model = make_tiny_model(label_count=30, head_label_count=4, group_size=4, fan_in=8, training=False)
    message = rf"`head` must be True, False or None \(the default placement\), got {head!r}\."
    with pytest.raises(ValueError, match=message) as refused:
        model.add_labels(["w60 w61"], tokenizer=tokenizer, head=head)
    assert "\n" not in str(refused.value)
    assert model.config.label_count == 30


@pytest.mark.parametrize(
    ("fields", "head_label_count", "in_head"),
    [
        ({}, 4, True),  # head and tail read the same features: the head (issue 36: it won every mode on deps and tags)
        ({"head_projection_dim": 16}, 4, False),  # the head reads its own projection: the tail
        ({"tail_projection_dim": 16}, 4, False),
        ({}, 0, False),  # no head
        ({}, 30, True),  # no tail
    ],
)
def test_new_labels_go_to_the_head_by_default_where_it_reads_the_tails_features(
    tokenizer, fields, head_label_count, in_head
):
    model = make_tiny_model(
        label_count=30, head_label_count=head_label_count, group_size=4, fan_in=8, training=False, **fields
    )
    assert default_placement_is_head(model.output_layer) is in_head
    model.add_labels(["w60 w61", "w62 w63"], tokenizer=tokenizer)
    assert model.config.head_label_count == head_label_count + (2 if in_head else 0)
    tail_ids = model.output_layer.output_labels[model.config.head_label_count :]
    assert bool((tail_ids >= 30).any()) is not in_head
