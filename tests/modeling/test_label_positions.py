"""The label checks of haste_hf.modeling.label_positions: what a layout fixes and what may be given beside it
(`label_count_and_head`, for `from_encoder_pretrained`), and how a `labels` tensor is read (`dense_labels`)."""

from types import SimpleNamespace

import pytest
import torch

from haste_hf import LabelLayout
from haste_hf.modeling.label_positions import (
    check_layout,
    dense_labels,
    label_count_and_head,
    output_labels_from_frequencies,
)


def layout_of_10() -> LabelLayout:
    return LabelLayout(
        label_count=10, head_ids=torch.tensor([9, 3]), tail_order=torch.tensor([0, 1, 2, 4, 5, 6, 7, 8]), group_size=4
    )


@pytest.mark.parametrize("head_label_count", [None, 2])
def test_a_layout_gives_the_label_count_head_and_group_size(head_label_count):
    """Left out or equal to the layout's, the head count is the layout's; so are the label count and group size."""
    config_kwargs = {}
    counts = label_count_and_head(None, head_label_count, None, layout_of_10(), None, None, config_kwargs)
    assert counts == (10, 2) and config_kwargs == {"group_size": 4}


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(head_label_count=3), r"`head_label_count` \(3\) differs from the layout's head \(2 labels\)"),
        (dict(label_frequencies=[1] * 10), "leave out label_frequencies"),
        (dict(head_label_fraction=0.2), "leave out head_label_fraction"),
    ],
)
def test_what_a_layout_fixes_is_refused_beside_it(arguments, message):
    given = dict(label_count=None, head_label_count=None, head_label_fraction=None, label_frequencies=None)
    given.update(arguments)
    with pytest.raises(ValueError, match=message):
        label_count_and_head(
            given["label_count"],
            given["head_label_count"],
            given["head_label_fraction"],
            layout_of_10(),
            given["label_frequencies"],
            None,
            {},
        )


def test_without_a_layout_the_label_count_is_needed_and_one_head_setting():
    with pytest.raises(ValueError, match="Give `label_count`"):
        label_count_and_head(None, 2, None, None, None, None, {})
    with pytest.raises(ValueError, match="not both"):
        label_count_and_head(10, 2, 0.2, None, None, None, {})


def test_an_integer_multi_hot_of_0s_and_1s_is_read_as_one_and_padded_ids_are_not():
    """What `MultiLabelBinarizer` gives (int64 0s and 1s, one column per label) is a multi-hot, as are bool and float
    targets in [0, 1]; padded label ids (any other integers) are not; with 2 labels or fewer the two integer readings
    cannot be told apart and are refused."""
    multi_hot = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    assert torch.equal(dense_labels(multi_hot, 3, 5), multi_hot.bool())
    soft = multi_hot.float() * 0.75 + (multi_hot == 0) * 0.25  # float targets anywhere in [0, 1], ends included
    soft[0, 0], soft[1, 0] = 0.0, 1.0
    for dense in (multi_hot.bool(), multi_hot.float(), soft):
        assert dense_labels(dense, 3, 5) is dense
    assert dense_labels(torch.tensor([[3, 4, 1, 0, -100], [2, -100, -100, -100, -100]]), 2, 5) is None
    assert dense_labels(torch.tensor([[1, 1, 1, 1, 1]]), 1, 5).all()
    with pytest.raises(ValueError, match="read both as a multi-hot and as padded label ids"):
        dense_labels(torch.tensor([[0, 1], [1, 1]]), 2, 2)


@pytest.mark.parametrize(
    "labels, message",
    [
        (torch.zeros(3, 4), r"A dense multi-hot `labels` needs 5 columns, got 4: pass one column per label"),
        (torch.zeros(3, 6, dtype=torch.bool), "needs 5 columns, got 6"),
        (torch.zeros(3), r"`labels` must be 2-D with one row per example, got shape \(3,\)"),
        (torch.zeros(2, 5), r"one row per example, got shape \(2, 5\)"),
        (torch.full((3, 5), 1.5), r"must hold targets in \[0, 1\]"),
    ],
)
def test_a_malformed_labels_tensor_is_refused_naming_the_fix(labels, message):
    with pytest.raises(ValueError, match=message):
        dense_labels(labels, 3, 5)


def test_a_head_label_fraction_outside_0_to_1_is_refused_and_its_ends_are_taken():
    for fraction in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"`head_label_fraction` must lie in \[0, 1\]"):
            label_count_and_head(10, None, fraction, None, None, None, {})
    assert label_count_and_head(10, None, 0.0, None, None, None, {}) == (10, 0)
    assert label_count_and_head(10, None, 1.0, None, None, None, {}) == (10, 10)


def shape_of_10():
    """A layer's shape: 10 labels, a head of 2, a tail of 2 groups of 4."""
    return SimpleNamespace(label_count=10, head_label_count=2, tail_group_count=2, group_size=4)


FREQUENCIES = torch.tensor([5, 1, 1, 9, 2, 3, 0, 0, 4, 1])


def test_output_positions_put_the_most_frequent_labels_first_then_the_tail_in_the_order_given():
    """The 2 most frequent labels (3, 0) head the positions; the tail follows by frequency (ties by id), or in a
    grouping's order (an object with `order` and `group_size`, or the ids alone); padding slots are -1."""
    by_frequency = output_labels_from_frequencies(shape_of_10(), FREQUENCIES)
    assert by_frequency.tolist() == [3, 0, 8, 5, 4, 1, 2, 9, 6, 7]
    order = torch.tensor([7, 6, 9, 2, 1, 4, 5, 8])
    for tail_order in (order, SimpleNamespace(order=order, group_size=4), order.tolist()):
        positions = output_labels_from_frequencies(shape_of_10(), FREQUENCIES, tail_order)
        assert positions.dtype == torch.int64 and positions.tolist() == [3, 0, *order.tolist()]
    padded = SimpleNamespace(label_count=9, head_label_count=2, tail_group_count=2, group_size=4)
    assert output_labels_from_frequencies(padded, FREQUENCIES[:9]).tolist() == [3, 0, 8, 5, 4, 1, 2, 6, 7, -1]


@pytest.mark.parametrize(
    ("frequencies", "tail_order", "message"),
    [
        (FREQUENCIES[:9], None, r"one count per label \(10\), got shape \(9,\)"),
        (FREQUENCIES, SimpleNamespace(order=torch.arange(8), group_size=2), "groups of 2 labels, but the model's"),
        (FREQUENCIES, torch.tensor([7, 6, 9, 2, 1, 4, 5]), "order exactly the tail labels"),
        (FREQUENCIES, torch.tensor([7, 6, 9, 2, 1, 4, 5, 5]), "order exactly the tail labels"),
        (FREQUENCIES, torch.tensor([7, 6, 9, 2, 1, 4, 5, 3]), "order exactly the tail labels"),
    ],
    ids=["frequencies-of-9", "other-group-size", "short-order", "repeated-id", "head-label-in-the-tail"],
)
def test_frequencies_or_a_tail_order_that_do_not_fit_the_layer_are_refused(frequencies, tail_order, message):
    with pytest.raises(ValueError, match=message):
        output_labels_from_frequencies(shape_of_10(), frequencies, tail_order)


@pytest.mark.parametrize(
    ("layout", "label_count", "group_size", "message"),
    [
        (layout_of_10(), 11, None, r"`label_count` \(11\) differs from the layout's \(10\)"),
        (layout_of_10(), None, 2, r"`group_size` \(2\) differs from the layout's G \(4\)"),
        (
            SimpleNamespace(label_count=10, head_ids=[9, 3], tail_order=[0, 1, 2, 4, 5, 6, 7, 7], group_size=4),
            None,
            None,
            "every label id in \\[0, 10\\) exactly once",
        ),
    ],
    ids=["label-count", "group-size", "repeated-label"],
)
def test_a_layout_that_disagrees_with_the_model_or_misses_a_label_is_refused(layout, label_count, group_size, message):
    with pytest.raises(ValueError, match=message):
        check_layout(layout, label_count, group_size)
    assert check_layout(layout_of_10(), 10, 4) == (10, 2)


def test_frequencies_past_2_to_the_24_are_ordered_exactly():
    """Counts that float32 cannot tell apart (2**24 and 2**24 + 1) still put the more frequent label first."""
    shape = SimpleNamespace(label_count=4, head_label_count=1, tail_group_count=1, group_size=3)
    frequencies = torch.tensor([2**24, 2**24 + 1, 3, 2**24 - 1], dtype=torch.int64)
    assert output_labels_from_frequencies(shape, frequencies).tolist() == [1, 0, 3, 2]
