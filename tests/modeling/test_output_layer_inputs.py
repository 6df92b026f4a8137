"""What `HasteOutputLayer` and the model refuse: a head given as True or 2.5, an empty batch's loss, features of the
wrong width or rank, NaN scores to rank, tail supports edited out of range. Each is one `ValueError` naming what
is wrong, where the layer used to take it (a 1-label head, label 2) or fail deep inside (ZeroDivisionError, shape
and index errors), or rank NaN-scored labels first."""

import pytest
import torch
from tiny_haste import make_tiny_model

from haste_hf import HasteOutputLayer


def make_layer():
    torch.manual_seed(0)
    return HasteOutputLayer(16, 20, head_labels=3, group_size=4, fan_in=4)


@pytest.mark.parametrize("head_labels", [True, False, 2.5, 3.0, [1.0, 2.0], torch.tensor([True, False])])
def test_a_head_that_is_no_count_nor_ids_is_refused(head_labels):
    with pytest.raises(ValueError, match="`head_labels` must be a number of labels"):
        HasteOutputLayer(16, 20, head_labels=head_labels, fan_in=4)


def test_integer_heads_still_build():
    assert HasteOutputLayer(16, 20, head_labels=2, fan_in=4).head_label_count == 2
    assert HasteOutputLayer(16, 20, head_labels=[5, 7], fan_in=4).output_labels[:2].tolist() == [5, 7]


def test_an_empty_batch_has_no_loss_but_ranks_and_scores_to_empty_tensors():
    layer = make_layer()
    with pytest.raises(ValueError, match="`features` holds no example"):
        layer(torch.zeros(0, 16), labels=torch.zeros(0, 2, dtype=torch.long))
    assert layer.topk(torch.zeros(0, 16), 3).label_ids.shape == (0, 3)
    assert layer(torch.zeros(0, 16)).logits.shape == (0, 20)


@pytest.mark.parametrize("shape", [(2, 17), (2, 3, 16), (16,)])
def test_features_of_another_shape_are_refused_naming_the_width(shape):
    layer = make_layer()
    for call in (lambda x: layer.topk(x, 3), lambda x: layer(x), lambda x: layer.loss(x, torch.zeros(2, 1).long())):
        with pytest.raises(ValueError, match=r"`features` must be a \[batch, 16\] tensor"):
            call(torch.zeros(shape))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_scores_are_refused_not_ranked_first(bad):
    layer = make_layer()
    features = torch.randn(3, 16)
    features[1, 0] = bad
    if bad == float("inf"):  # an infinite feature gives NaN where its weights cancel
        with torch.no_grad():
            layer.head.weight[0].zero_()
    for call in (lambda: layer.topk(features, 3), lambda: layer(features, top_k=3)):
        with pytest.raises(ValueError, match="scores hold NaN"):
            call()
    assert layer.topk(features[[0, 2]], 3).label_ids.shape == (2, 3)  # finite rows still rank


def test_nan_scores_are_returned_in_a_process_group_of_several_ranks(monkeypatch):
    """One rank raising alone would leave the others waiting in their next collective: in a group of several ranks
    NaN scores come back, first, for the caller to check once gathered (a group of 2 stood in for by its answers)."""
    import torch.distributed as dist

    layer = make_layer()
    features = torch.randn(3, 16)
    features[1, 0] = float("nan")
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    ranked = layer.topk(features, 3)
    assert ranked.scores[1].isnan().all() and not ranked.scores[[0, 2]].isnan().any()


def test_supports_edited_out_of_range_are_refused_once_changed():
    layer = make_layer()
    features = torch.randn(2, 16)
    expected = layer.topk(features, 3).label_ids
    with torch.no_grad():
        layer.tail.supports[1, 0] = 16
    with pytest.raises(ValueError, match=r"`tail.supports` holds feature indices in \[\d+, 16\], outside \[0, 16\)"):
        layer.topk(features, 3)
    with torch.no_grad():
        layer.tail.supports[1, 0] = -1
    with pytest.raises(ValueError, match="`tail.supports`"):
        layer(features, labels=torch.tensor([[0], [5]]))
    with torch.no_grad():  # repaired: served again
        layer.tail.supports.copy_(make_layer().tail.supports)
    assert torch.equal(layer.topk(features, 3).label_ids, expected)


def test_the_model_refuses_an_empty_batch_and_nan_scores():
    model = make_tiny_model(label_count=20, training=False)
    empty = torch.zeros(0, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="`features` holds no example"):
        model(input_ids=empty, attention_mask=torch.ones_like(empty), labels=torch.zeros(0, 2, dtype=torch.long))
    with torch.no_grad():
        model.output_layer.head.weight[0, 0] = float("nan")
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="scores hold NaN"):
        model.predict_topk(input_ids=ids, attention_mask=torch.ones_like(ids), k=3)


def test_a_layer_made_under_inference_mode_still_ranks():
    features = torch.randn(2, 16)
    expected = make_layer().topk(features, 3).label_ids
    with torch.inference_mode():
        assert torch.equal(make_layer().topk(features, 3).label_ids, expected)
