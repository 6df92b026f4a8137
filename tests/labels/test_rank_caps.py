"""`haste_hf/labels/rank_caps.py`: a new label is expected to enter the top-1 and top-5 of texts that do not carry
it at most as often as the trained labels nearest its text do (issue 36, "never worse than before adding")."""

import pytest
import torch

from haste_hf.labels import priors, rank_caps
from haste_hf.modeling.output_layer import HasteOutputLayer


def test_from_the_tail_on_the_cap_is_the_order_statistic_just_enough_and_never_raises_one():
    """Allowances of the tail's margins or more (18 of 300): the label enters each top at most `floor(allowance)` times on
    the reference, and any less lowering enters one of them once too often; a label below its allowance is kept."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(300, 5, generator=generator) * 2
    thresholds = torch.randn(300, 2, generator=generator).sort(dim=1, descending=True).values + 1
    allowed = torch.tensor([[20, 20], [20.5, 30.7], [40, 80], [300, 300], [25, 299]], dtype=torch.float64)
    shift = rank_caps.rank_caps(scores, thresholds, allowed)
    assert (shift >= 0).all() and shift[3] == 0
    for label in range(5):
        for rank in range(2):
            above = scores[:, label].double() - shift[label] > thresholds[:, rank].double()
            assert above.sum() <= allowed[label, rank].floor()
        if shift[label] > 0:
            less = scores[:, label].double() - shift[label] + rank_caps.CAP_CLEARANCE + 1e-6
            assert any((less > thresholds[:, rank]).sum() > allowed[label, rank].floor() for rank in range(2))


@pytest.mark.parametrize("allowance", [0.01, 0.1, 0.5, 2.0, 8.0])
def test_fresh_texts_see_no_more_entries_than_allowed_however_high_the_level(allowance):
    """The cap bounds the entries expected on fresh texts drawn like the reference, not the reference's count alone:
    labels of levels up to 10 logits above the trained tops are capped on 1,000 reference texts (6 draws), then
    their entries counted on 100,000 fresh ones. On average over the labels (what the full ranking pays) they stay
    under the allowance per 1,000 texts, each within 8x of it; and above a fiftieth of it (not vacuous)."""
    ratios = []
    for seed in range(6):
        generator = torch.Generator().manual_seed(seed)
        levels, spread = torch.linspace(0, 10, 6), torch.tensor([1.0, 2.0, 1.5, 1.0, 0.7, 2.5])

        def draw(count, generator=generator, levels=levels, spread=spread):
            return torch.randn(count, 6, generator=generator) * spread + levels, torch.randn(
                count, 1, generator=generator
            )

        scores, thresholds = draw(1000)
        shift = rank_caps.rank_caps(scores, thresholds, torch.full((6, 1), allowance, dtype=torch.float64))
        fresh, fresh_thresholds = draw(100_000)
        ratios.append((fresh.double() - shift > fresh_thresholds.double()).sum(dim=0).double() / 100 / allowance)
    ratios = torch.cat(ratios)
    assert ratios.mean() <= 1.0 and ratios.max() <= 8 and ratios.mean() >= 0.02, ratios


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
        assert topped < 0.1
    else:
        assert (entries > allowed.floor()).any() and topped > 0.5
