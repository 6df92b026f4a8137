"""Bad labels are refused naming the fix; every label format gives the right loss."""

import pytest
import torch
from faults import LABELS, make_model


# ------------------------------------------------------------------------------------------ labels and data


def batch(model, size=3):
    torch.manual_seed(1)
    return torch.randint(5, 100, (size, 7)), torch.ones(size, 7, dtype=torch.long)


@pytest.mark.parametrize(
    "labels, message",
    [
        (torch.full((3, LABELS), 2.0), "targets in \\[0, 1\\]"),
        (torch.full((3, LABELS), -0.5), "targets in \\[0, 1\\]"),
        (torch.zeros(3, LABELS).index_fill_(1, torch.tensor([4]), float("nan")), "NaN is not one"),
        (torch.tensor([[1, 2], [3, 0], [5, 6]], dtype=torch.uint8), "dtype torch.uint8"),
        (torch.tensor([[1, 40], [3, -100], [5, 6]]), "outside \\[0, 40\\)"),
        (torch.tensor([[1, -7], [3, -100], [5, 6]]), "outside \\[0, 40\\)"),
        (torch.zeros(3, LABELS - 1), "needs 40 columns, got 39"),
    ],
)
def test_bad_labels_are_refused(labels, message):
    model = make_model()
    input_ids, attention_mask = batch(model)
    with pytest.raises(ValueError, match=message):
        model(input_ids, attention_mask, labels=labels)


def test_labels_as_int8_ids_bool_uint8_multi_hot_or_soft_targets_give_the_right_loss():
    model = make_model().eval()
    input_ids, attention_mask = batch(model)
    ids = torch.tensor([[1, 2], [3, -100], [5, 39]])
    dense = torch.zeros(3, LABELS)
    dense[[0, 0, 1, 2, 2], [1, 2, 3, 5, 39]] = 1.0
    reference = model(input_ids, attention_mask, labels=ids).loss
    for labels in (ids.to(torch.int8), ids.to(torch.int32), dense.bool(), dense, dense.to(torch.uint8)):
        assert torch.allclose(model(input_ids, attention_mask, labels=labels).loss, reference)
    soft = dense * 0.5
    logits = model(input_ids, attention_mask).logits
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, soft, reduction="sum") / 3
    assert torch.allclose(model(input_ids, attention_mask, labels=soft).loss, expected, rtol=1e-5)


def test_semantic_grouping_of_labels_without_any_positive_keeps_them_all():
    from haste_hf.labels.grouping import group_labels

    grouping = group_labels(torch.zeros(LABELS, 8), torch.arange(4, LABELS), 4, "semantic", device="cpu")
    assert sorted(grouping.order.tolist()) == list(range(4, LABELS))
