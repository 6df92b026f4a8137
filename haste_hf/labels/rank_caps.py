# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""A cap on how high a new label may rank (issue 36, "never worse"): a new label's level comes from its text's
nearest trained labels, and a fit on a few examples sharpens it; either can put it above the trained labels on
texts it does not fit far more often than a trained label of its frequency goes there, and every such text loses
its right top label. On reference texts that carry none of the new labels, each trained label's false entries
into the top-1 and the top-5 of a text are counted (a text it scores `p` does not carry it with probability
`1 - p`); a new label's bias is lowered, never raised, until the number of fresh texts like the reference whose
top it would enter is expected to be at most the number its nearest trained labels enter falsely
(`priors.calibrate_new_labels`).

The expectation, not the count on the reference: a label lowered until it enters the top of k of n reference
texts still enters about (k + 1) / (n + 1) of fresh ones, and 4,306 new labels on deps, whose neighbours enter a
top-1 0.01 times in 2,048 texts, are each allowed none, which the reference's count cannot resolve (the largest
margin only bounds it at 1 / (n + 1)). So the margins of a label over the texts' k-th trained logit are taken
as a sample: above the `TAIL_MARGINS`-th largest, their tail is extrapolated as exponential (the mean excess of
the largest over it), and the label is lowered to where `n` fresh texts would see `allowance` entries. A linear
scorer's logits have tails no heavier than exponential (about Gaussian), so the extrapolation overestimates the
entries and the cap errs low. However high the level was set (a fit sure of itself, a level 10 logits too
high), the capped label's expected false entries are its neighbours': the guarantee does not rest on the level."""

import torch


# The ranks a new label is capped at (`rank_caps`): it enters the top-1 and the top-5 over the trained labels of
# fresh texts like the reference at most as often as the trained labels nearest its text enter them falsely there,
# times `RANK_CAP_FACTOR`.
CAPPED_RANKS = (1, 5)
RANK_CAP_FACTOR = 1.0
CAP_CLEARANCE = 1e-3
# The largest margins the exponential tail is fitted on: a sixteenth of the reference texts, at least
# `TAIL_MARGINS` (fewer are too noisy a mean excess: Gaussian margins on 1,000 texts, 16 of them, let 2x the
# allowance through on average at an allowance of 0.01; a sixteenth, 0.2x). And the least allowance (expected
# entries in the reference's count of texts) a label gets where its neighbours never enter a top falsely.
TAIL_MARGINS, TAIL_FRACTION = 16, 1 / 16
LEAST_ALLOWANCE = 1e-3


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
    """`[m]` how far to lower each new label's logits so that, on fresh texts like the `n` reference texts (none of
    which carries it), it is expected to enter the top of each rank of `CAPPED_RANKS` at most `allowed`
    `[m, len(CAPPED_RANKS)]` times in `n` (floored at `LEAST_ALLOWANCE`): `scores` `[n, m]` its logits there,
    `thresholds` `[n, len(CAPPED_RANKS)]` (`rank_thresholds`). Below `j` entries (`n * TAIL_FRACTION`, at least
    `TAIL_MARGINS`) the margins' tail is extrapolated as exponential from the `j` largest (the expected count above
    `t` is `j exp(-(t - m_j) / their mean excess over m_j)`); from `j` on the margins' own order statistic is the
    cap. Only lowers."""
    count = scores.shape[0]
    tail = min(max(TAIL_MARGINS, int(count * TAIL_FRACTION)), count - 1)
    shift = torch.zeros(scores.shape[1], dtype=torch.float64, device=scores.device)
    for index in range(thresholds.shape[1]):
        margins = (scores.double() - thresholds[:, index : index + 1].double()).sort(dim=0, descending=True).values
        allowance = allowed[:, index].double().to(scores.device).clamp(min=LEAST_ALLOWANCE)
        # The (kept + 1)-th largest margin: lowered by it, the label stays above the threshold `kept` times.
        kept = allowance.floor().long().clamp(0, count - 1)
        level = margins.gather(0, kept.unsqueeze(0)).squeeze(0)
        if tail >= 1:
            base = margins[tail]
            excess = (margins[:tail] - base).mean(dim=0).clamp(min=1e-6)
            extrapolated = base + excess * torch.log(tail / allowance)
            level = torch.where(allowance < tail, extrapolated, level)
        # `CAP_CLEARANCE` below it: its float32 bias would put the label back on the threshold by rounding.
        shift = torch.maximum(shift, (level + CAP_CLEARANCE).clamp(min=0))
    return shift


__all__ = ["CAPPED_RANKS", "RANK_CAP_FACTOR", "rank_caps", "rank_thresholds"]
