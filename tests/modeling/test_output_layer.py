"""`HasteOutputLayer` on its own: any features `[B, d]`, built from (d, L, head labels or a LabelLayout, G, F)."""

import numpy as np
import pytest
import torch

from haste_hf import HasteOutputLayer, LabelLayout


def random_labels(batch_size, label_count, positives, generator):
    labels = torch.randint(0, label_count, (batch_size, positives), generator=generator)
    return labels.masked_fill(torch.rand(batch_size, positives, generator=generator) < 0.3, -100)


@pytest.mark.parametrize("head_labels", [0, 7, 43, "ids"])
@pytest.mark.parametrize("projections", [False, True])
def test_loss_top_k_and_logits_agree_with_the_materialised_reference(head_labels, projections):
    generator = torch.Generator().manual_seed(len(str(head_labels)) + projections)
    torch.manual_seed(int(projections))
    if head_labels == "ids":
        head_labels = torch.randperm(43, generator=generator)[:5]
    dims = dict(head_projection_dim=6, tail_projection_dim=10) if projections else {}
    layer = HasteOutputLayer(12, 43, head_labels, group_size=4, fan_in=5, tail_bias=True, **dims)  # padding slots
    if not isinstance(head_labels, int):
        assert torch.equal(layer.output_labels[:5], head_labels)
    features = torch.randn(6, 12, generator=generator, requires_grad=True)
    labels = random_labels(6, 43, 4, generator)
    loss = layer.loss(features, labels)
    loss.backward()
    grads = [p.grad.clone() for p in layer.parameters()] + [features.grad.clone()]
    layer.zero_grad()
    features.grad = None
    reference = layer.reference_loss(layer.position_logits(features), labels)
    reference.backward()
    torch.testing.assert_close(loss, reference)
    for grad, expected in zip(grads, [p.grad for p in layer.parameters()] + [features.grad]):
        torch.testing.assert_close(grad, expected)
    with torch.no_grad():
        logits = layer.logits(features)
        top = layer.topk(features, 9)
    assert logits.shape == (6, 43)
    torch.testing.assert_close(top.scores, logits.topk(9).values)
    torch.testing.assert_close(logits.gather(1, top.label_ids), top.scores)
    dense = torch.zeros(6, 43).scatter_(1, labels.clamp(min=0), (labels >= 0).float())
    torch.testing.assert_close(layer(features, labels=dense, return_logits=False).loss, reference)


def test_a_label_layout_gives_head_tail_order_and_group_size():
    layout = LabelLayout(
        label_count=20,
        head_ids=torch.tensor([4, 9]),
        tail_order=torch.tensor([i for i in range(20) if i not in (4, 9)]),
        group_size=4,
    )
    layer = HasteOutputLayer(8, head_labels=layout, fan_in=3)
    assert (layer.label_count, layer.head_label_count, layer.group_size) == (20, 2, 4)
    assert torch.equal(layer.output_labels, layout.output_labels())
    with pytest.raises(ValueError, match="`group_size` \\(8\\) differs from the layout's G \\(4\\)"):
        HasteOutputLayer(8, head_labels=layout, group_size=8, fan_in=3)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(label_count=None), "Give `label_count`"),
        (dict(fan_in=20), "`fan_in` \\(20\\) exceeds the tail's input size \\(12\\)"),
        (dict(head_labels=[3, 3]), "lists a label twice"),
        (dict(head_labels=[30]), "outside \\[0, 30\\)"),
        (dict(head_labels=31), "between 0 and label_count=30"),
        (dict(group_size=0), "`group_size` must be a positive integer"),
        (dict(loss="hinge"), "`loss` must be one of"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        HasteOutputLayer(**{"in_features": 12, "label_count": 30, "group_size": 4, "fan_in": 5, **arguments})


def test_invariants_refuse_padding_before_the_last_labels():
    layer = HasteOutputLayer(12, 30, np.int64(2), group_size=4, fan_in=5)  # 28 tail labels in 7 full groups: no padding
    assert layer.head_label_count == 2  # a count, whatever its integer type
    layer.check_invariants()
    padded = HasteOutputLayer(
        12, 31, 2, group_size=4, fan_in=5
    )  # the last group holds 1 label and 3 padding slots (positions 31-33)
    with torch.no_grad():
        padded.output_labels[[5, 31]] = padded.output_labels[[31, 5]]  # a padding slot among the labels
    with pytest.raises(ValueError, match="each of the 31 labels exactly once"):
        padded.check_invariants("this layer")


def test_invariants_refuse_tail_supports_outside_the_features_or_repeated_and_pass_a_layer_of_no_tail():
    HasteOutputLayer(12, 8, 8, group_size=4, fan_in=5).check_invariants()  # a head alone: no supports to check
    for position, value, message in (
        ((2, 0), 12, r"this layer: tail supports hold feature indices in \[\d+, 12\], outside \[0, 12\)"),
        ((2, 0), -1, r"this layer: tail supports hold feature indices in \[-1, \d+\], outside \[0, 12\)"),
        ((2, 1), None, r"this layer: tail group 2 lists a feature twice in its support"),
    ):
        layer = HasteOutputLayer(12, 30, 2, group_size=4, fan_in=5)
        layer.check_invariants()
        supports = layer.tail.supports.clone()
        supports[position] = supports[2, 0] if value is None else value
        layer.tail.supports = supports
        with pytest.raises(ValueError, match=message):
            layer.check_invariants("this layer")


def test_rewiring_scores_a_tail_label_0_and_leaves_only_the_padding_slots_out():
    """Label id 0 alone in the last tail group, beside 3 padding slots: its weights decide which slot is rewired
    (were it taken for padding, the group would have no label to score); the padding slots' weights do not."""
    layout = LabelLayout(
        label_count=10, head_ids=torch.tensor([9]), tail_order=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 0]), group_size=4
    )
    layer = HasteOutputLayer(16, head_labels=layout, fan_in=4)
    assert layer.output_labels[-4:].tolist() == [0, -1, -1, -1]
    with torch.no_grad():
        layer.tail.weight[2, 0] = torch.tensor([0.5, 0.01, 0.9, 0.7])  # label 0: slot 1 is its weakest
        layer.tail.weight[2, 1:] = torch.tensor([0.0, 5.0, 0.0, 0.0])  # padding: scored too, slot 0 would be
    result, count = layer.rewire_(fraction=0.25, scope="group", init="zero", seed=0, step=1)
    assert count == 3  # one slot of each of the 3 groups
    assert result.slots[result.groups == 2].tolist() == [1]


def test_rows_from_label_embeddings_are_their_centred_texts_scaled_to_the_default_norm():
    """`init_from_label_embeddings_` without projections: a head label's row is its embedding less the center, a tail
    label's weights that difference on its group's support, each normalised to `scale * INITIAL_ROW_NORM`; the other
    labels keep their rows."""
    from haste_hf.modeling.output_layer import INITIAL_ROW_NORM

    torch.manual_seed(0)
    layer = HasteOutputLayer(12, 30, 4, group_size=4, fan_in=5)
    before = layer.head.weight.clone(), layer.tail.weight.clone()
    ids = torch.tensor([int(layer.output_labels[1]), int(layer.output_labels[9])])  # a head label, a tail label
    embeddings, center = torch.randn(2, 12), torch.randn(12)
    layer.init_from_label_embeddings_(ids, embeddings, scale=0.5, center=center)
    norm = 0.5 * INITIAL_ROW_NORM
    torch.testing.assert_close(
        layer.head.weight[1], torch.nn.functional.normalize(embeddings[0] - center, dim=0) * norm
    )
    group, member = divmod(9 - 4, 4)
    on_support = (embeddings[1] - center)[layer.tail.supports[group].long()]
    torch.testing.assert_close(
        layer.tail.weight[group, member], torch.nn.functional.normalize(on_support, dim=0) * norm
    )
    head_kept = torch.ones(4, dtype=torch.bool)
    head_kept[1] = False
    assert torch.equal(layer.head.weight[head_kept], before[0][head_kept])
    tail_kept = torch.ones(layer.tail.weight.shape[:2], dtype=torch.bool)
    tail_kept[group, member] = False
    assert torch.equal(layer.tail.weight[tail_kept], before[1][tail_kept])


@pytest.mark.parametrize(
    ("ids", "embeddings", "scale", "message"),
    [
        ([0, -1], (2, 12), 1.0, r"`label_ids` holds ids outside \[0, 30\): give label ids of this layer\."),
        ([0, 30], (2, 12), 1.0, r"`label_ids` holds ids outside \[0, 30\): give label ids of this layer\."),
        ([3, 3], (2, 12), 1.0, r"`label_ids` lists a label twice: give each label once\."),
        (
            [0, 1],
            (2, 11),
            1.0,
            r"Give one embedding of 12 features per label id: got \(2,\) ids and embeddings of shape \(2, 11\)",
        ),
        ([0, 1], (3, 12), 1.0, r"Give one embedding of 12 features per label id"),
        ([[0, 1]], (2, 12), 1.0, r"Give one embedding of 12 features per label id: got \(1, 2\) ids"),
        ([0, 1], (2, 12), 0.0, r"`scale` \(of the rows' norm\) must be a positive number, got 0\.0\."),
        ([0, 1], (2, 12), float("inf"), r"`scale` \(of the rows' norm\) must be a positive number, got inf\."),
        ([0, 1], (2, 12), True, r"`scale` \(of the rows' norm\) must be a positive number, got True\."),
    ],
)
def test_rows_from_label_embeddings_refuse_ids_out_of_range_repeated_or_unmatched(ids, embeddings, scale, message):
    layer = HasteOutputLayer(12, 30, 4, group_size=4, fan_in=5)
    before = layer.head.weight.clone(), layer.tail.weight.clone()
    with pytest.raises(ValueError, match="^" + message):
        layer.init_from_label_embeddings_(ids, torch.randn(*embeddings), scale=scale)
    assert torch.equal(layer.head.weight, before[0]) and torch.equal(layer.tail.weight, before[1])
