"""`priors`' access to the trained tail labels: gathered for the labels asked alone (issue 37: every tail label's
weights and per-label supports at once held three copies of an 8.6M-label tail while labels were added)."""

import pytest
import torch
from tiny_haste import make_tiny_model

from haste_hf.labels.priors import tail_label_positions, tail_weights_at


@pytest.mark.parametrize("tail_bias", [False, True])
def test_tail_rows_are_the_per_label_weights_supports_and_biases(tail_bias):
    """On random weights, shuffled labels and a padded last group, the rows asked equal those of every tail label
    expanded per label (what `add_labels` read before), and only they are gathered."""
    model = make_tiny_model(
        label_count=43, head_label_count=5, group_size=4, fan_in=8, shuffle_labels=True, training=False,
        tail_bias=tail_bias,
    )  # fmt: skip
    layer = model.output_layer
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_()
    labels, positions = tail_label_positions(layer)
    tail_ids = layer.output_labels[layer.tail_first_position :]
    valid = tail_ids >= 0
    assert torch.equal(labels, tail_ids[valid]) and labels.numel() == 38  # the padding of the last group left out
    every_weight = layer.tail.weight.float().flatten(0, 1)[valid]
    every_support = layer.tail.supports.long().repeat_interleave(layer.group_size, dim=0)[valid]
    rows = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(1))[:9]
    weights, supports, bias = tail_weights_at(layer, positions[rows])
    assert weights.shape == supports.shape == (9, 8) and supports.dtype == torch.int64
    assert torch.equal(weights, every_weight[rows]) and torch.equal(supports, every_support[rows])
    if tail_bias:
        assert torch.equal(bias, layer.tail.bias.float()[valid][rows])
    else:
        assert bias is None


def test_the_tail_map_is_distilled_on_the_reference_from_eight_trained_labels_on():
    """`mapped_weights` of the tail: with the reference texts' tail inputs and at least 8 trained tail labels to
    learn from, the scale is one of `SCALES` (distilled on the reference, a quarter of the labels held out); with
    fewer, or with no reference, the trained labels' norm alone sets it and the reference changes nothing."""
    from haste_hf.labels.priors import BLENDS, SCALES, mapped_weights

    model = make_tiny_model(label_count=43, head_label_count=5, shuffle_labels=True, training=False)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    width = layer.head.weight.shape[1]
    new_x = torch.randn(3, width, generator=generator)
    reference = torch.randn(20, layer.tail.in_features, generator=generator)
    tail_ids, _ = tail_label_positions(layer)
    for trained in (5, 7, 8, 16):
        label_ids = tail_ids[:trained]
        label_x = torch.randn(trained, width, generator=generator)
        plain = mapped_weights(layer, "tail", new_x, label_x, label_ids)
        distilled = mapped_weights(layer, "tail", new_x, label_x, label_ids, reference, BLENDS)
        assert plain.scale not in SCALES
        if trained < 8:
            assert torch.equal(distilled.weights, plain.weights) and distilled.scale == plain.scale, trained
        else:
            assert distilled.scale in SCALES, trained
