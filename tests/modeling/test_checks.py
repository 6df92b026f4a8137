"""The output layer's and the encoder's checks (`haste_hf.modeling.checks`), each refusal on its own: a loaded
layer's invariants, the layer's arguments, the encoder's inputs, ranked scores, label names."""

import logging

import pytest
import torch

from haste_hf.modeling.checks import (
    _check_ranked_scores,
    _describe,
    check_encoder_inputs,
    check_features,
    check_layer_arguments,
    check_output_layer_invariants,
    checked_label_names,
)
from haste_hf.modeling.output_layer import HasteOutputLayer


PLACED = r"^this layer: `output_labels` must place each of the 31 labels exactly once \(padding -1\)"


def padded_layer():
    """31 labels: 2 in the head, 29 in 8 tail groups of 4 (positions 31-33 are the padding slots of the last)."""
    return HasteOutputLayer(12, 31, 2, group_size=4, fan_in=5)


@pytest.mark.parametrize(
    ("position", "value"),
    [(4, -1), (31, 0), (4, 31), (4, "the id at 5")],
    ids=["a label unplaced", "padding that places a label", "an id past the count", "a label twice"],
)
def test_output_labels_that_do_not_place_each_label_once_are_refused(position, value):
    layer = padded_layer()
    check_output_layer_invariants(layer, "this layer")
    with torch.no_grad():
        layer.output_labels[position] = int(layer.output_labels[5]) if value == "the id at 5" else value
    with pytest.raises(ValueError, match=PLACED):
        check_output_layer_invariants(layer, "this layer")


def test_a_layer_of_no_padding_or_no_tail_passes():
    check_output_layer_invariants(HasteOutputLayer(12, 30, 2, group_size=4, fan_in=5))
    check_output_layer_invariants(HasteOutputLayer(12, 8, 8, group_size=4, fan_in=5))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (12, r"tail supports hold feature indices in \[\d+, 12\], outside \[0, 12\)"),
        (-1, r"tail supports hold feature indices in \[-1, \d+\], outside \[0, 12\)"),
        (None, r"tail group 2 lists a feature twice in its support"),
    ],
)
def test_tail_supports_out_of_range_or_repeated_are_refused(value, message):
    layer = padded_layer()
    supports = layer.tail.supports.clone()
    supports[2, 1] = supports[2, 0] if value is None else value
    layer.tail.supports = supports
    with pytest.raises(ValueError, match="^the output layer: " + message):
        check_output_layer_invariants(layer)


def test_ranked_scores_holding_nan_are_refused_on_the_cpu():
    _check_ranked_scores(torch.tensor([[3.0, -torch.inf]]))
    with pytest.raises(ValueError, match="^The scores hold NaN"):
        _check_ranked_scores(torch.tensor([[1.0, float("nan")]]))


GOOD = dict(
    in_features=12,
    label_count=30,
    head_label_count=2,
    group_size=4,
    fan_in=5,
    head_projection_dim=None,
    tail_projection_dim=None,
)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"in_features": 0}, r"`in_features` must be a positive integer, got 0\."),
        ({"label_count": 2.0}, r"`label_count` must be a positive integer, got 2\.0\."),
        ({"group_size": True}, r"`group_size` must be a positive integer, got True\."),
        ({"fan_in": -1}, r"`fan_in` must be a positive integer, got -1\."),
        ({"head_projection_dim": 0}, r"`head_projection_dim` must be a positive integer or None, got 0\."),
        ({"tail_projection_dim": "8"}, r"`tail_projection_dim` must be a positive integer or None, got '8'\."),
        ({"head_label_count": -1}, r"The head must hold between 0 and label_count=30 labels, got -1\."),
        ({"head_label_count": 31}, r"The head must hold between 0 and label_count=30 labels, got 31\."),
        ({"head_label_count": True}, r"The head must hold between 0 and label_count=30 labels, got True\."),
        ({"fan_in": 13}, r"`fan_in` \(13\) exceeds the tail's input size \(12\)"),
        ({"fan_in": 9, "tail_projection_dim": 8}, r"`fan_in` \(9\) exceeds the tail's input size \(8\)"),
    ],
)
def test_each_layer_argument_out_of_range_is_refused_by_name(changes, message):
    with pytest.raises(ValueError, match="^" + message):
        check_layer_arguments(**{**GOOD, **changes})


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"head_label_count": 0},
        {"head_label_count": 30, "fan_in": 13},  # a head alone: no tail to connect
        {"fan_in": 12},
        {"fan_in": 16, "tail_projection_dim": 16, "head_projection_dim": 1},
    ],
)
def test_layer_arguments_in_range_pass(changes):
    check_layer_arguments(**{**GOOD, **changes})


def test_encoder_inputs_need_tokens_and_no_more_than_the_encoders_positions():
    ids = torch.zeros(2, 8, dtype=torch.long)
    check_encoder_inputs(ids, None, 8)
    check_encoder_inputs(ids, None, None)
    check_encoder_inputs(None, torch.zeros(2, 9, 4), 8)
    with pytest.raises(ValueError, match=r"^HasteForExtremeClassification got no `input_ids`: tokenize"):
        check_encoder_inputs(None, None, 8)
    with pytest.raises(ValueError, match=r"^`input_ids` holds texts of 8 tokens, and the encoder reads at most 7"):
        check_encoder_inputs(ids, None, 7)


@pytest.mark.parametrize(
    ("features", "shape"),
    [
        (torch.zeros(2, 5), r"\(2, 5\)"),
        (torch.zeros(6), r"\(6,\)"),
        (torch.zeros(1, 2, 6), r"\(1, 2, 6\)"),
        ([0.0], "list"),
    ],
)
def test_features_of_another_shape_are_refused(features, shape):
    check_features(torch.zeros(3, 6), 6)
    with pytest.raises(ValueError, match=rf"^`features` must be a \[batch, 6\] tensor, got {shape}\.$"):
        check_features(features, 6)


def test_a_layers_shape_is_described_with_the_settings_it_has():
    assert _describe((32, 100, 5, 4, 8, None, None, False)) == "100 labels, head 5, G 4, F 8, on 32 features"
    assert _describe((32, 100, 5, 4, 8, 16, 24, True)) == (
        "100 labels, head 5, G 4, F 8, on 32 features, head_projection_dim 16, tail_projection_dim 24, tail_bias True"
    )


class Logger:
    def __init__(self):
        self.warnings = []

    def warning_once(self, message):
        self.warnings.append(message)


def test_label_names_are_strings_empty_ones_named_by_id_and_repeats_warned_of():
    logger = Logger()
    assert checked_label_names(None, 3, logger) is None and logger.warnings == []
    assert checked_label_names(["a", 7, "c"], 3, logger) == ["a", "7", "c"] and logger.warnings == []
    assert checked_label_names(["a", " ", "a"], 3, logger) == ["a", "LABEL_1", "a"]
    (warning,) = logger.warnings
    assert (
        "1 empty name(s), named LABEL_<id> (e.g. label [1]); 1 repeated name(s) (e.g. [\"'a' for labels 0 and 2\"])"
        in warning
    )
    for names, count in ((["a", "b"], "2 entries"), ("abc", "a string")):
        with pytest.raises(ValueError, match=rf"^`label_names` has {count} for 3 labels: give a list"):
            checked_label_names(names, 3, logging.getLogger())
