"""`haste_hf/labels/rank_caps.py`: a new label enters the top-1 and top-5 of reference texts that do not carry it
at most as often as trained labels of its frequency do (issue 36, "never worse than before adding")."""

import math

import pytest
import torch

from haste_hf.labels import priors, rank_caps
from haste_hf.modeling.output_layer import HasteOutputLayer


def test_the_cap_lowers_each_label_just_enough_and_never_raises_one():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(300, 7, generator=generator) * 2
    thresholds = torch.randn(300, 2, generator=generator).sort(dim=1, descending=True).values + 1
    allowed = torch.tensor([[0, 0], [0.5, 3.7], [2, 10], [40, 80], [300, 300], [1, 1], [0, 299]], dtype=torch.float64)
    shift = rank_caps.rank_caps(scores, thresholds, allowed)
    kept = rank_caps.poisson_median(allowed.flatten()).view(7, 2)
    assert kept[1].tolist() == [0, 4] and kept[5].tolist() == [1, 1]  # the median, not the mean rounded down
    assert (shift >= 0).all() and shift[4] == 0
    for label in range(7):
        for rank in range(2):
            above = scores[:, label].double() - shift[label] > thresholds[:, rank].double()
            assert above.sum() <= kept[label, rank]
        if shift[label] > 0:  # any less and one rank's top is entered once too often
            less = scores[:, label].double() - shift[label] + rank_caps.CAP_CLEARANCE + 1e-6
            assert any((less > thresholds[:, rank]).sum() > kept[label, rank] for rank in range(2))


def test_a_label_keeps_the_median_count_of_a_poisson_draw_of_its_allowance():
    """`poisson_median`: the smallest count whose Poisson distribution function reaches 1/2, against the sum of the
    probabilities; 0 for an allowance of 0.01 (deps' typical one), 1 from ln 2 on."""
    expected = torch.tensor([0.0, 0.01, 0.5, 0.69, 0.7, 0.82, 1.0, 1.67, 1.68, 2.5, 3.7, 10.0, 37.3, 299.6])
    medians = rank_caps.poisson_median(expected)
    for mean, median in zip(expected.double().tolist(), medians.tolist()):
        counts = torch.arange(0, 400, dtype=torch.float64)
        cdf = torch.exp(counts * math.log(max(mean, 1e-300)) - mean - torch.lgamma(counts + 1)).cumsum(0)
        assert median == int((cdf < 0.5).sum()), (mean, median)
    assert medians[:6].tolist() == [0, 0, 0, 0, 1, 1]


def test_the_thresholds_and_false_counts_are_the_trained_tops():
    torch.manual_seed(0)
    layer = HasteOutputLayer(8, 40, 6, 4, 4).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            if parameter.is_floating_point():
                parameter.normal_()
    reference = torch.randn(50, 8)
    thresholds, counts = rank_caps.rank_thresholds(layer, reference)
    logits = layer.logits(reference).float()
    values, labels = logits.topk(5, dim=1)
    torch.testing.assert_close(thresholds, values[:, [0, 4]])
    missed = 1 - torch.sigmoid(values).double()
    for index, rank in enumerate((1, 5)):
        expected = torch.zeros(40, dtype=torch.float64).index_add_(
            0, labels[:, :rank].flatten(), missed[:, :rank].flatten()
        )
        torch.testing.assert_close(counts[index], expected)


@pytest.mark.parametrize("capped", [True, False])
def test_a_level_ten_logits_too_high_is_capped_where_trained_labels_rank(capped, monkeypatch):
    """New labels whose level comes out 10 logits too high (an uncalibrated level, or a fit sure of itself) would
    top every text; capped, they enter the top-1 and top-5 of the reference texts no more often than their
    neighbours do falsely, and the top-1 of fresh texts stays the trained labels'. Without the cap it breaks."""
    from tiny_haste import make_tiny_model

    from haste_hf.labels.additions import NewLabelWeights, branch_features, place_new_labels

    model = make_tiny_model(label_count=43, head_label_count=5, shuffle_labels=True, training=False)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    width = layer.head.weight.shape[1]
    with torch.no_grad():  # logits of spread 2 about -3, as a trained layer's
        for parameter in layer.parameters():
            if parameter.is_floating_point():
                parameter.normal_(generator=generator).mul_(2 / width**0.5) if parameter.dim() > 1 else parameter.fill_(
                    -3
                )
    count = 6
    embedded = torch.randn(count + 200 + 43, width, generator=generator)
    features = {branch: branch_features(layer, embedded, branch) for branch in ("head", "tail")}
    rows, fit_rows, fit_ids = torch.arange(count, count + 200), torch.arange(count + 200, count + 243), torch.arange(43)
    weights = NewLabelWeights(layer, place_new_labels(layer, count, None, 0), count)
    with torch.no_grad():
        for parameter in weights.parameters():
            parameter.normal_(generator=generator).mul_(2 / width**0.5 if parameter.dim() > 1 else 0)
    solve = priors.solve_offsets
    monkeypatch.setattr(priors, "solve_offsets", lambda *args, **kwargs: solve(*args, **kwargs) + 10)
    if not capped:
        monkeypatch.setattr(priors, "RANK_CAP_FACTOR", 1e9)
    priors.calibrate_new_labels(layer, weights, embedded, features, (rows, fit_rows, fit_ids))
    thresholds, false_counts = rank_caps.rank_thresholds(layer, embedded[rows])
    new = weights.logits(features["head"][rows], features["tail"][rows])
    entries = (new.unsqueeze(2) > thresholds.unsqueeze(1)).sum(dim=0)  # [count, ranks]
    allowed = false_counts.max(dim=1).values
    fresh = torch.randn(100, width, generator=generator)
    old = layer.logits(fresh)
    topped = (
        (
            weights.logits(*(branch_features(layer, fresh, b) for b in ("head", "tail"))).max(dim=1).values
            > old.max(dim=1).values
        )
        .float()
        .mean()
    )
    if capped:
        assert (entries <= rank_caps.poisson_median(allowed.flatten()).view(allowed.shape)).all(), (entries, allowed)
        assert topped < 0.1
    else:
        assert (entries > rank_caps.poisson_median(allowed.flatten()).view(allowed.shape)).any() and topped > 0.5
