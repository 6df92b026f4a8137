# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""A cap on how high a new label may rank (issue 36, "never worse"): a new label's level comes from its text's
nearest trained labels, and a fit on a few examples sharpens it; either can put it above the trained labels on
texts it does not fit far more often than a trained label of its frequency goes there, and every such text loses
its right top label. On reference texts that carry none of the new labels, each trained label's false entries
into the top-1 and the top-5 of a text are counted (a text it scores `p` does not carry it with probability
`1 - p`); a new label's bias is lowered, never raised, until it enters those tops there at most as often as the
trained labels nearest its text do (`priors.calibrate_new_labels`): at most the median count of a Poisson draw of
their mean (`poisson_median`), the count a trained label of that rate reaches at least half the time."""

import math

import torch


# The ranks a new label is capped at (`rank_caps`): it enters the top-1 and the top-5 over the trained labels of
# the reference texts at most as often as the trained labels nearest its text enter them falsely, times
# `RANK_CAP_FACTOR`.
CAPPED_RANKS = (1, 5)
RANK_CAP_FACTOR = 1.0
CAP_CLEARANCE = 1e-3


@torch.no_grad()
def rank_thresholds(layer, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(thresholds [n, len(CAPPED_RANKS)], false_counts [len(CAPPED_RANKS), label_count])`: on each reference text
    `[n, d]` (in the layer's dtype), the trained labels' logit at each rank of `CAPPED_RANKS` (a new label scoring
    above it enters that top); and how often each trained label sits in that top of a text that does not carry it,
    a text where it scores `p` not carrying it with probability `1 - p` (the sum of `1 - p` over the texts whose
    top holds it). Scored a few texts at a time, as `priors.label_masses`."""
    deepest = min(max(CAPPED_RANKS), layer.label_count)
    thresholds = torch.empty(reference.shape[0], len(CAPPED_RANKS), device=reference.device)
    counts = torch.zeros(len(CAPPED_RANKS), layer.label_count, dtype=torch.float64, device=reference.device)
    chunk = max(1, (1 << 27) // max(layer.label_count, 1))
    for start in range(0, reference.shape[0], chunk):
        logits = layer.logits(reference[start : start + chunk]).float()
        values, labels = logits.topk(deepest, dim=1)
        missed = 1 - torch.sigmoid(values).double()
        for index, rank in enumerate(CAPPED_RANKS):
            rank = min(rank, deepest)
            thresholds[start : start + chunk, index] = values[:, rank - 1]
            counts[index].index_add_(0, labels[:, :rank].flatten(), missed[:, :rank].flatten())
    return thresholds, counts


@torch.no_grad()
def rank_caps(scores: torch.Tensor, thresholds: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`[m]` how far to lower each new label's logits so that it enters the top of each rank of `CAPPED_RANKS` on
    at most `poisson_median(allowed)` (`allowed` `[m, len(CAPPED_RANKS)]`) of the reference texts, none of which
    carries it: `scores` `[n, m]`
    its logits there, `thresholds` `[n, len(CAPPED_RANKS)]` (`rank_thresholds`). A level from the neighbours' mass
    or a fit on a few examples can put a label above the trained labels on texts it does not fit, where a trained
    label of its frequency rarely goes (deps, one seed: a fitted label cost 0.38 P@1); the cap only lowers."""
    shift = torch.zeros(scores.shape[1], dtype=torch.float64, device=scores.device)
    for index in range(thresholds.shape[1]):
        margins = (scores.double() - thresholds[:, index : index + 1].double()).sort(dim=0, descending=True).values
        # The (kept + 1)-th largest margin: lowered by it, the label stays above the threshold `kept` times.
        kept = poisson_median(allowed[:, index]).clamp(0, margins.shape[0] - 1).to(scores.device)
        # `CAP_CLEARANCE` below it: its float32 bias would put the label back on the threshold by rounding.
        shift = torch.maximum(shift, (margins.gather(0, kept.unsqueeze(0)).squeeze(0) + CAP_CLEARANCE).clamp(min=0))
    return shift


def poisson_median(expected: torch.Tensor) -> torch.Tensor:
    """`[m]` (int64) the median of a Poisson count of mean `expected` `[m]`: the entries a new label keeps where its
    neighbours enter `expected` times. A count on a few hundred reference texts is a draw, not a mean: rounding the
    mean down takes a label whose neighbours enter 0.8 times out of a top it enters once (the planted test's head
    label, capped off 9 of its 12 own texts); rounding up keeps one entry for a label whose neighbours make 0.01 (on
    deps, 4,306 new labels one entry each in 1,024 reference texts: four new labels atop every text). The median lies in `[expected - ln 2, expected + 1/3)` (Choi, 1994): of the two integers
    there, the smaller whose distribution function reaches 1/2."""
    expected = expected.double().clamp(min=0)
    low = (expected - math.log(2)).ceil().clamp(min=0)
    # P(N <= low) = Q(low + 1, expected), the regularised upper incomplete gamma function.
    return torch.where(torch.special.gammaincc(low + 1, expected) >= 0.5, low, low + 1).long()


__all__ = ["CAPPED_RANKS", "RANK_CAP_FACTOR", "poisson_median", "rank_caps", "rank_thresholds"]
