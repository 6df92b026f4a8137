# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What a trained model knows about labels it never saw: the map from a label's text to its weights, and the score
level a label of its expected frequency has. `additions.py` places and fits the new labels with them.

The text map. A trained label's weights on a branch (the head's row and bias; the tail's F weights scattered onto
the branch's features, zero off its support, and its bias where the tail has one) are a function of its text that
training found. A ridge regression from the pooled features of the trained labels' texts to those weights learns
it; its penalty is the one of a small grid with the least leave-one-out error (closed form from one SVD). The ridge
shrinks a label the trained labels say little about to their mean weights, which rank texts by nothing of the
label's own (deps, one H200: held-out R@5 13.3 from the map alone against 20.3 for the bare encoder's cosine). So
on the tail a new label's weights are the map's prediction plus a copy of its text's own tail inputs (less their
mean over the trained labels' texts), scaled to the map's spread: what a similarity between its text and a text
knows (`blended_map`). The copy's weight and one factor on the whole are distilled on trained labels
(`distilled_blend`): 256 of them held out of a second map, their mapped weights for each weight and factor of a
grid scored on the reference texts, each with the bias that gives it its trained mass there, against the trained
model's own probabilities (cross-entropy). A map from text knows less than training did; at full norm its weights
would be surer of themselves than they know. The copy is used only with negatives: its scores on real texts sit on
a level no label name shows (a bag-of-words encoder put new labels above every old one on planted texts without
them), and only real texts can calibrate it. A head row takes the copy at the fixed weight `HEAD_BLEND`.

The level. A label's scores over the texts the model reads have a level set by its frequency: training with BCE
leaves each trained label's bias where the gradient of its loss in the bias vanishes, its sigmoid scores summed
over the training texts equal to the number of them that carry it. A new label's frequency is not observed; it is
taken from the trained labels whose texts are nearest its own (the mean log of their masses on the reference texts,
`nearest_log_masses`): a ridge regression of the log-mass on the text shrank every new label toward the mean
frequency (deps: labels seen once in training got 11x an old one's level, those seen 256 times or more 1/300 of
it), and the same mis-levelling reordered the new labels among themselves.

On reference texts that carry none of the new labels (the negatives, training texts tagged with none of them;
else half the trained labels' texts, the model's label names), a new label can only score false positives. Each
trained label's false-positive mass there is the sum of `p (1 - p)` over its scores `p` (a text scored `p` carries
it with probability `p`); a new label's mass on the reference is set to that of the trained labels nearest its text.
Summing a new label's own text as a positive against the negatives instead (the previous version: its scores summed
over its positives and the negatives equal to its positives' count) gave every label the density `k / 2048` of its
`k` positives among 2,048 negatives, 10x a typical trained label's, and its own text, which it scores near 1, said
it was sure of its positives (the version before that, measured on deps, set a new label's mass on the negatives
to a trained label's whole mass there, its positives included: new labels' scores of 0.9-1.0 were true 9% of the
time, old labels' 84%). With examples (given with negatives), the examples say how sure of its
positives the label is: its bias is where its BCE over the training texts is stationary, its examples standing for
the fraction `rho` of them that carries it (the nearest trained labels' mass on the negatives over their count)
and the negatives for the rest (`balanced_offsets`).

Offsets are solved per label by a few vectorised Newton steps on the log of the mass. The offset is the label's
bias: a tail trained without bias (the default) gains one when labels are added, zero for the existing labels,
whose scores stay bit-identical (`x + 0.0 == x`). (The level could instead ride on the weights along the features'
mean, but MiniLM's features have no direction of near-constant projection: such an offset would add noise of a
third of itself to every score.)

Cost at L trained labels: their masses on 2,048 reference texts (one pass of the output layer, O(L)), and their
top-1 / top-5 there for the rank caps (`rank_caps.py`, a second pass); the new labels scored a chunk at a time; the
ridge map on at most `MAX_MAP_LABELS` of them (O(n d^2)); the nearest trained labels of each new text (one matmul of
the new texts against those label texts); the distillation on 256 trained labels. Seconds at 43K labels; at 10^7,
`benchmarks/label_addition_scale.py` times each part (under a minute on an H200).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers.utils.logging import is_progress_bar_enabled

from .rank_caps import RANK_CAP_FACTOR, rank_caps, rank_thresholds


# The ridge penalties tried, as multiples of the mean squared singular value of the centred inputs.
RIDGE_GRID = (1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
# At most this many trained labels fit the map (drawn at random beyond it): the fit costs O(n d^2), and more
# labels than a few features squared add little.
MAX_MAP_LABELS = 100_000
# Reference texts the masses are measured on.
REFERENCE_TEXTS = 2048
NEWTON_STEPS = 30
DEFAULT_PRIOR_STRENGTH = 1.0
LABEL_CHUNK = 8192
# Factors tried on the mapped tail weights (`distilled_blend`), on this many trained labels held out of the map.
SCALES = tuple(2.0 ** (step / 2) for step in range(-6, 7))
SCALE_LABELS = 256
# Weights tried on the copy of a text's own centred branch features, added to the ridge map's prediction
# (`distilled_blend`), in units of the map's own spread about its mean.
BLENDS = (0.0, 0.5, 1.0, 2.0, 4.0)
# A new label's expected frequency is that of this many trained labels whose texts are nearest its own.
NEAREST_LABELS = 16
# A head row's copy of its text's own head inputs (`blended_map`), with negatives; not distilled. Deps, seed 0, the
# CPU harness, held-out R@5 with the damped level below: 22.1 at 0.25, 21.3 at 0.5 (the map alone 19.8 unlevelled).
HEAD_BLEND = 0.25
# The fraction of a head label's own level kept about the trained labels' mean (`calibrate_new_labels`): each
# new label's neighbours' mass measures its frequency with noise, which in the head reorders the new labels among
# themselves (deps, seed 0, the map alone: held-out R@5 18.4 at the full level, 19.8 at one common level).
HEAD_LEVEL_SPREAD = 0.5


@dataclass
class RidgeMap:
    """`inputs [n, d] -> targets [n, k]`: `(inputs - input_mean) @ coefficients + target_mean`."""

    input_mean: torch.Tensor
    coefficients: torch.Tensor
    target_mean: torch.Tensor
    penalty: float

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return (inputs.double() - self.input_mean) @ self.coefficients + self.target_mean


class RidgeFitter:
    """Ridge regressions from one set of inputs `[n, d]` to any targets, the penalty of each chosen by leave-one-out
    error over `RIDGE_GRID`; one SVD of the inputs serves them all."""

    def __init__(self, inputs: torch.Tensor):
        inputs = inputs.double()
        self.input_mean = inputs.mean(dim=0)
        self.u, self.s, self.vh = torch.linalg.svd(inputs - self.input_mean, full_matrices=False)
        self.u_squared = self.u.square()

    def fit(self, targets: torch.Tensor) -> RidgeMap:
        targets = targets.double()
        target_mean = targets.mean(dim=0)
        centred = targets - target_mean
        projected = self.u.T @ centred  # [d, k]
        s2 = self.s.square()
        spread = s2.mean().clamp(min=1e-12)  # texts that all embed alike (unknown words) map to the mean target
        best = None
        for relative in RIDGE_GRID:
            shrink = s2 / (s2 + relative * spread)
            residual = centred - self.u @ (shrink.unsqueeze(1) * projected)
            leverage = (self.u_squared @ shrink).clamp(max=1 - 1e-6)
            error = (residual / (1 - leverage).unsqueeze(1)).square().sum().item()
            if best is None or error < best[0]:
                best = (error, relative)
        penalty = best[1] * spread
        coefficients = self.vh.T @ ((self.s / (s2 + penalty)).unsqueeze(1) * projected)
        return RidgeMap(self.input_mean, coefficients, target_mean, float(penalty))


def map_labels(label_count: int, seed: int) -> torch.Tensor:
    """The trained label ids the map is fitted on: all of them, or `MAX_MAP_LABELS` drawn at random."""
    if label_count <= MAX_MAP_LABELS:
        return torch.arange(label_count)
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(label_count, generator=generator)[:MAX_MAP_LABELS].sort().values


@torch.no_grad()
def tail_label_positions(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """`(labels [n], positions [n])`: every tail label and its position among the tail's outputs (its group is
    `position // G`)."""
    ids = layer.output_labels[layer.tail_first_position :]
    positions = (ids >= 0).nonzero().squeeze(1)
    return ids[positions], positions


@torch.no_grad()
def tail_weights_at(layer, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`(weights [m, F], supports [m, F], biases [m] or None)` of the tail labels at `positions`, gathered for these
    alone: every label's at once were copies of the whole tail (8.4M labels: 4 GB of weights and, repeated per
    label, two 8.6 GB copies of the int64 supports)."""
    weights = layer.tail.weight.flatten(0, 1)[positions].float()
    supports = layer.tail.supports[positions // layer.group_size].long()
    bias = None if layer.tail.bias is None else layer.tail.bias[positions].float()
    return weights, supports, bias


@torch.no_grad()
def label_masses(layer, reference: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`([label_count], [label_count])` each trained label's mass on the reference features `[n, d]` (the sum of its
    sigmoid scores `p`) and its false-positive mass there (the sum of `p (1 - p)`: what a calibrated label scores on
    the texts that do not carry it, a text scored `p` carrying it with probability `p`); scored a few texts at a
    time (about 2^27 scores a chunk)."""
    mass = torch.zeros(2, layer.label_count, dtype=torch.float64, device=reference.device)
    chunk = max(1, (1 << 27) // max(layer.label_count, 1))
    for start in range(0, reference.shape[0], chunk):
        probabilities = torch.sigmoid(layer.logits(reference[start : start + chunk].to(_input_dtype(layer))).float())
        mass[0] += probabilities.sum(dim=0).double()
        mass[1] += (probabilities * (1 - probabilities)).sum(dim=0).double()
    return mass[0], mass[1]


def _input_dtype(layer) -> torch.dtype:
    module = layer.head_projection or layer.head or layer.tail_projection or layer.tail
    return module.weight.dtype


@torch.no_grad()
def solve_offsets(scores_of, target_log_mass: torch.Tensor, steps: int = NEWTON_STEPS) -> torch.Tensor:
    """`[m]` the offset `beta` of each label such that `logsumexp(logsigmoid(a + beta * c))` over the reference is
    `target_log_mass`, where `scores_of(labels) -> (a, c)` gives each label's scores `a [n, m']` on the reference
    and the score direction `c [n, m']` the offset moves (1 for a bias). Newton on the log-mass, which is increasing
    and convex-concave in `beta`, with steps bounded to 4 so that a flat start cannot throw it off."""
    offsets = torch.zeros_like(target_log_mass)
    for start in range(0, target_log_mass.numel(), LABEL_CHUNK):
        labels = torch.arange(start, min(start + LABEL_CHUNK, target_log_mass.numel()), device=offsets.device)
        scores, direction = scores_of(labels)
        beta = torch.zeros(labels.numel(), dtype=torch.float64, device=offsets.device)
        target = target_log_mass[labels]
        for _ in range(steps):
            z = scores + beta * direction
            log_p = F.logsigmoid(z)
            log_mass = torch.logsumexp(log_p, dim=0)
            slope = (torch.exp(log_p + F.logsigmoid(-z) - log_mass) * direction).sum(dim=0)
            beta = beta - ((log_mass - target) / slope.clamp(min=1e-9)).clamp(-4.0, 4.0)
        offsets[labels] = beta
    return offsets


def log_mass_floor(reference_count: int) -> float:
    """A floor on the masses whose log is regressed: a label that never scores above ~0 still has some mass."""
    return math.log(1e-3 / max(reference_count, 1))


@dataclass
class StartingWeights:
    """Where the new labels start: `weights` `[count, d_branch]` (head rows, or dense tail vectors whose values on
    a label's support become its weights, times `scale`; unit vectors times `norm` for the fallback) and `bias`."""

    weights: torch.Tensor
    bias: torch.Tensor | None
    scale: float = 1.0
    norm: float | None = None

    def on_supports(self, supports: torch.Tensor) -> torch.Tensor:
        on_support = self.weights.gather(1, supports)
        if self.norm is not None:
            return F.normalize(on_support, dim=1) * self.norm
        return on_support * self.scale


@torch.no_grad()
def mapped_weights(layer, branch, new_x, label_x, label_ids, reference_tail=None, blends=(0.0,)):
    """The `StartingWeights` of texts `new_x` `[count, d]` on `branch`, from the ridge map fitted on the trained
    labels `label_ids` whose texts are `label_x`; None when the branch holds fewer than 2 of them. The tail's scale
    and the weight of the copy of the text (`blended_map`) are distilled on the tail inputs `reference_tail` of
    reference texts (`distilled_blend`) where given, from the grid `blends`; the head takes the one weight of
    `blends` (`HEAD_BLEND` from `add_labels`)."""
    positions = layer.label_positions.to(label_ids.device)[label_ids]
    if branch == "head":
        rows, targets = head_map_targets(layer, label_ids, positions)
        if int(rows.sum()) < 2:
            return None
        (blend,) = blends
        copies = branch_copies(layer, label_x[rows], "head")
        predicted = blended_map(RidgeFitter(label_x[rows]).fit(targets), copies.mean(dim=0), blend)(
            new_x, branch_copies(layer, new_x, "head")
        )
        width = layer.head.weight.shape[1]
        return StartingWeights(predicted[:, :width], predicted[:, width] if layer.head.bias is not None else None)
    ids, positions = tail_label_positions(layer)
    row_of = torch.full((layer.label_count,), -1, dtype=torch.int64, device=ids.device)
    row_of[ids] = torch.arange(ids.numel(), device=ids.device)
    in_tail = row_of[label_ids.to(ids.device)] >= 0
    if int(in_tail.sum()) < 2:
        return None
    # The map's labels alone (at most `MAX_MAP_LABELS`), gathered once; `rows` index them.
    weights, supports, bias = tail_weights_at(layer, positions[row_of[label_ids.to(ids.device)][in_tail]])
    rows = torch.arange(weights.shape[0], device=ids.device)
    texts = label_x[in_tail.to(label_x.device)]
    width = layer.tail.in_features
    dense = torch.zeros(rows.numel(), width, device=weights.device).scatter_(1, supports[rows], weights[rows])
    targets = dense if bias is None else torch.cat([dense, bias[rows].unsqueeze(1)], dim=1)
    copies = branch_copies(layer, texts, "tail")
    blend, scale = 0.0, None
    if reference_tail is not None and rows.numel() >= 8:
        tail = (weights, supports, bias)
        blend, scale = distilled_blend(texts, copies, targets, rows, tail, reference_tail, blends)
    predicted = blended_map(RidgeFitter(texts).fit(targets), copies.mean(dim=0), blend)(
        new_x, branch_copies(layer, new_x, "tail")
    )
    if scale is None:  # the dense map spreads a label's weight over every feature: the trained labels' norm on it
        scale = float(weights[rows].norm(dim=1).mean() / predicted[:, :width].norm(dim=1).mean().clamp(min=1e-12))
    return StartingWeights(predicted[:, :width], predicted[:, width] if bias is not None else None, scale=scale)


@torch.no_grad()
def head_map_targets(layer, label_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rows [n] bool, targets [rows, d (+1)])`: the trained labels of `label_ids` (at output `positions`) a head
    row is learnt from, and their weights as head rows (with the head's bias where it has one). Where the head and
    the tail read the same features (neither has a projection), every trained label is a head row in all but
    frequency: a tail label's F weights scattered onto the features, its bias (0 without one). The head's labels
    alone are its most frequent ones, whose texts say little of a rarer label's weights (deps, seed 0: a head row
    mapped from the 1,162 head labels ranked held-out labels at R@5 17.3, from every label 23.4, on 2,296 of them)."""
    head_rows = positions < layer.head_label_count
    shared = layer.head_projection is None and layer.tail_projection is None and layer.tail is not None
    rows = torch.ones_like(head_rows) if shared else head_rows
    width = layer.head.weight.shape[1]
    targets = torch.zeros(int(rows.sum()), width + (layer.head.bias is not None), device=positions.device)
    in_head = head_rows[rows]
    targets[in_head, :width] = layer.head.weight.float()[positions[head_rows]]
    if layer.head.bias is not None:
        targets[in_head, width] = layer.head.bias.float()[positions[head_rows]]
    if shared and bool((~in_head).any()):
        ids, tail_positions = tail_label_positions(layer)
        row_of = torch.full((layer.label_count,), -1, dtype=torch.int64, device=ids.device)
        row_of[ids] = torch.arange(ids.numel(), device=ids.device)
        weights, supports, bias = tail_weights_at(layer, tail_positions[row_of[label_ids[~head_rows].to(ids.device)]])
        tail_targets = torch.zeros(weights.shape[0], width, device=weights.device).scatter_(1, supports, weights)
        targets[~in_head, :width] = tail_targets.to(targets.device)
        if layer.head.bias is not None and bias is not None:
            targets[~in_head, width] = bias.to(targets.device)
    return rows, targets


def branch_copies(layer, x: torch.Tensor, branch: str) -> torch.Tensor:
    """`[n, d_branch]` the `branch` ("head" or "tail") inputs of pooled features `x`, in float32: what a copy of a
    text's embedding is."""
    projection = getattr(layer, f"{branch}_projection")
    return x.float() if projection is None else projection(x.to(projection.weight.dtype)).float()


def blended_map(text_map: RidgeMap, copy_mean: torch.Tensor, blend: float):
    """`(texts [n, d], copies [n, d_tail]) -> [n, k]`: the ridge map's prediction plus `blend` times the texts' own
    tail inputs less `copy_mean`, scaled to the prediction's spread about its mean (on the first `d_tail` columns).
    The ridge shrinks a label the trained labels say little about to their mean weights, whose scores rank texts
    by nothing of its own; the copy keeps what a similarity between its text and a text knows."""

    def predict(texts: torch.Tensor, copies: torch.Tensor) -> torch.Tensor:
        predicted = text_map(texts).float()
        if blend:
            width = copies.shape[1]
            centred = copies - copy_mean
            spread = (predicted[:, :width] - text_map.target_mean[:width].float()).norm(dim=1).mean()
            predicted[:, :width] += blend * centred * (spread / centred.norm(dim=1).mean().clamp(min=1e-12))
        return predicted

    return predict


@torch.no_grad()
def distilled_blend(texts, copies, targets, rows, tail, reference, blends=BLENDS) -> tuple[float, float]:
    """`(blend, scale)`: the weight of the copy (`blended_map`) and the factor on the mapped tail weights under which
    they best reproduce trained labels' probabilities: labels held out of a second map, their mapped weights for
    each of `BLENDS` times each of `SCALES` (with the bias that matches their mass) scored on the `reference` tail
    inputs `[n, d_tail]`, against the sigmoid of their trained scores (cross-entropy). A map from text knows less
    than training did; its weights at full norm would be surer of themselves than they know."""
    weights, supports, bias = tail
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(rows.numel(), generator=generator).to(rows.device)
    held, rest = order[: min(SCALE_LABELS, rows.numel() // 4)], order[min(SCALE_LABELS, rows.numel() // 4) :]
    width = reference.shape[1]
    text_map = RidgeFitter(texts[rest]).fit(targets[rest])
    held_rows = rows[held]
    gathered = reference[:, supports[held_rows]]  # [n, h, F]
    trained = torch.einsum("nhf,hf->nh", gathered, weights[held_rows])
    probabilities = torch.sigmoid(trained + (0 if bias is None else bias[held_rows])).double()
    target = probabilities.sum(dim=0).clamp(min=1e-6).log()
    grid = [(blend, scale) for blend in blends for scale in SCALES]
    guessed = []
    for blend in blends:
        guess = blended_map(text_map, copies[rest].mean(dim=0), blend)(texts[held], copies[held])[:, :width]
        guessed.append(torch.einsum("nhf,hf->nh", gathered, guess.gather(1, supports[held_rows])).double())
    # Every point of the grid at once: one column per (blend, scale, held-out label), each with its own offset.
    z = torch.cat([scale * guessed[blends.index(blend)] for blend, scale in grid], dim=1)
    z += solve_offsets(lambda labels: (z[:, labels], 1.0), target.repeat(len(grid)))
    repeated = probabilities.repeat(1, len(grid))
    losses = -(repeated * F.logsigmoid(z) + (1 - repeated) * F.logsigmoid(-z)).view(z.shape[0], len(grid), -1)
    return grid[int(losses.sum(dim=(0, 2)).argmin())]


@torch.no_grad()
def balanced_offsets(
    negative_scores: torch.Tensor,
    positive_scores: torch.Tensor,
    positive_labels: torch.Tensor,
    density: torch.Tensor,
    steps: int = NEWTON_STEPS,
) -> torch.Tensor:
    """`[m]` the offset `beta` of each label at which the BCE gradient of its bias vanishes over the training texts,
    a fraction `density` of which carries it: its examples stand for those (their mean) and the negatives for the
    rest, `density * mean_pos sigmoid(a + beta) + (1 - density) * mean_neg sigmoid(b + beta) = density`, where
    `negative_scores` `[n_neg, m]` are the labels' scores on the negatives and `positive_scores` `[k]` the score of
    label `positive_labels[i]` on one of its examples. (Summing the few examples against the 2,048 negatives as they
    are gives every label the density `k / 2048`, 10x a typical trained label's.) Newton on the log of the left
    side, as `solve_offsets`; a label without examples gets 0."""
    count = negative_scores.shape[1]
    negative_scores, positive_scores = negative_scores.double(), positive_scores.double()
    density = density.double().to(negative_scores.device)
    per_label = torch.bincount(positive_labels, minlength=count).clamp(min=1).double().to(negative_scores.device)
    negative_weight = (1 - density).log() - math.log(negative_scores.shape[0])
    positive_weight = (density / per_label).log()[positive_labels]
    beta = torch.zeros(count, dtype=torch.float64, device=negative_scores.device)
    for _ in range(steps):
        negative, positive = negative_scores + beta, positive_scores + beta[positive_labels]
        # weighted log sigmoid and log (1 - sigmoid) of the scores on the negatives, then on each label's examples
        up, down = F.logsigmoid(negative) + negative_weight, F.logsigmoid(-negative)
        up_positive, down_positive = F.logsigmoid(positive) + positive_weight, F.logsigmoid(-positive)
        log_mass = torch.logsumexp(torch.cat([up, _scatter_logsumexp(up_positive, positive_labels, count)]), dim=0)
        log_slope = torch.logsumexp(
            torch.cat([up + down, _scatter_logsumexp(up_positive + down_positive, positive_labels, count)]), dim=0
        )
        beta = beta - ((log_mass - density.log()) / torch.exp(log_slope - log_mass).clamp(min=1e-9)).clamp(-4, 4)
    return beta


def _scatter_logsumexp(values: torch.Tensor, index: torch.Tensor, count: int) -> torch.Tensor:
    """`[1, count]` the logsumexp of `values` `[k]` grouped by `index` (-inf for a group without any)."""
    out = torch.full((count,), -math.inf, dtype=values.dtype, device=values.device)
    if values.numel():
        peak = torch.full_like(out, -math.inf).scatter_reduce(0, index, values, "amax")
        finite = torch.where(torch.isfinite(peak), peak, 0.0)
        summed = torch.zeros_like(out).index_add_(0, index, (values - finite[index]).exp())
        out = torch.where(summed > 0, summed.log() + finite, out)
    return out.unsqueeze(0)


@torch.no_grad()
def nearest_log_masses(label_x: torch.Tensor, log_masses: torch.Tensor, new_x: torch.Tensor) -> torch.Tensor:
    """`[count]` (or `[count, k]` for `log_masses` `[n, k]`) the mean log-mass of the `NEAREST_LABELS` trained
    labels whose texts `label_x` `[n, d]` are the most cosine-similar to each new text of `new_x` `[count, d]` (both
    centred on the trained texts' mean). A ridge regression of the log-mass on the text shrinks every label toward
    the mean frequency (deps, one H200: new labels seen once in training got 11x an old one's level, those seen 256
    times or more 1/300 of it); the neighbours keep the spread of the frequencies that resemble the text. New texts
    are compared a chunk at a time, about 2^26 similarities each."""
    centre = label_x.float().mean(dim=0)
    known = F.normalize(label_x.float() - centre, dim=1)
    k = min(NEAREST_LABELS, known.shape[0])
    chunk = max(1, (1 << 26) // max(known.shape[0], 1))
    parts = []
    for start in range(0, new_x.shape[0], chunk):
        query = F.normalize(new_x[start : start + chunk].float() - centre, dim=1)
        nearest = (query @ known.T).topk(k, dim=1).indices
        parts.append(log_masses.to(nearest.device)[nearest].mean(dim=1))
    return torch.cat(parts) if parts else log_masses.new_zeros(0, *log_masses.shape[1:])


def fit_new_labels(
    weights,
    positives: tuple[torch.Tensor | None, torch.Tensor | None],
    pairs: tuple[torch.Tensor, torch.Tensor],
    negatives: tuple[torch.Tensor | None, torch.Tensor | None],
    *,
    steps: int,
    learning_rate: float,
    prior_strength: float | None = None,
) -> list[float]:
    """Adam on the new weights alone: a MAP logistic fit per new label, the mean BCE of its positive pairs plus the
    mean BCE over the negatives, plus `prior_strength / 2` times the squared distance of its weights from where
    they started (the text's), relative to their mean squared norm, so that a few examples move a label from its
    text's weights without forgetting them. Its level is calibrated afterwards, so the balance of positives and
    negatives sets the direction alone. Returns the loss of each step."""
    prior_strength = DEFAULT_PRIOR_STRENGTH if prior_strength is None else prior_strength
    rows, labels = pairs
    pulled = [parameter for parameter in weights.parameters() if parameter.dim() > 1 and parameter.numel()]  # weights
    start = [parameter.detach().clone() for parameter in pulled]
    scales = [value.square().sum(dim=-1).mean().clamp(min=1e-12) for value in start]
    per_label = torch.bincount(labels, minlength=weights.count).clamp(min=1).float()
    optimizer = torch.optim.Adam(weights.parameters(), lr=learning_rate)
    losses = []
    for _ in tqdm(range(steps), desc="Fitting the new labels", unit="step", disable=not is_progress_bar_enabled()):
        optimizer.zero_grad(set_to_none=True)
        positive = (F.softplus(-weights.pair_logits(*positives, rows, labels)) / per_label[labels]).sum()
        negative = F.softplus(weights.logits(*negatives)).mean(dim=0).sum()
        prior = sum(
            (parameter - value).square().sum() / scale for parameter, value, scale in zip(pulled, start, scales)
        )
        loss = (positive + negative + prior_strength / 2 * prior) / weights.count
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def fallback_start(layer, branch: str, x: torch.Tensor, pairs, negative_rows, count: int) -> StartingWeights:
    """Without a map: each label's direction in the branch inputs `x` (the mean of its positive `pairs`' rows,
    minus the negatives' mean when there are some), at the mean norm of the branch's trained weights (mean bias)."""
    rows, labels = pairs
    direction = torch.zeros(count, x.shape[1], device=x.device).index_add_(0, labels, x[rows])
    direction /= torch.bincount(labels, minlength=count).unsqueeze(1)
    if negative_rows.numel():
        direction -= x[negative_rows].mean(dim=0)
    if branch == "head":
        head = layer.head.weight.float()
        bias = None if layer.head.bias is None else layer.head.bias.float().mean().expand(direction.shape[0])
        return StartingWeights(F.normalize(direction, dim=1) * head.norm(dim=1).mean(), bias)
    _, positions = tail_label_positions(layer)
    norms = torch.linalg.vector_norm(layer.tail.weight, dim=-1, dtype=torch.float32).flatten()[positions]
    bias = None if layer.tail.bias is None else layer.tail.bias.float()[positions].mean().expand(direction.shape[0])
    return StartingWeights(direction, bias, norm=float(norms.mean()))


@torch.no_grad()
def reference_rows(negative_rows, label_rows, map_ids, seed: int):
    """`(reference rows, rows of the label texts the mass map is fitted on, their label ids)`: the negatives and
    every label text; else half the label texts (at most `REFERENCE_TEXTS`) and the other half; None with neither."""
    if negative_rows.numel():
        return negative_rows[:REFERENCE_TEXTS], label_rows, map_ids
    if label_rows.numel() <= 2:
        return None
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(label_rows.numel(), generator=generator).to(label_rows.device)
    taken = min(REFERENCE_TEXTS, label_rows.numel() // 2)
    return label_rows[order[:taken]], label_rows[order[taken:]], map_ids.to(order.device)[order[taken:]]


def calibrate_new_labels(layer, weights, embedded, features, reference, examples=None) -> None:
    """The new labels' levels; left as they start where there is no reference. On the `reference` rows
    (`reference_rows`: the negatives, else half the trained labels' texts), none of which carries a new label:
    a label without examples gets the false-positive mass there of the trained labels nearest its text
    (`label_masses`, `nearest_log_masses`, `solve_offsets`), kept at `HEAD_LEVEL_SPREAD` of its distance from the
    trained labels' mean in the head. A label with `examples` `(rows, labels)` (the
    reference rows are then the negatives) gets the bias at which its BCE over the training texts is stationary, the
    fraction of them that carries it being the nearest trained labels' mass on the negatives over their count
    (`balanced_offsets`): its examples say how sure of them it is. Then each label's bias is lowered, never raised,
    until it enters the top-1 and the top-5 of the reference texts at most `RANK_CAP_FACTOR` times as often as those
    nearest trained labels enter them falsely (`rank_caps`). New labels are scored a chunk at a time."""
    if reference is None:
        return
    rows, fit_rows, fit_ids = reference
    inputs = tuple(None if x is None else x[rows] for x in (features.get("head"), features.get("tail")))
    floor = math.exp(log_mass_floor(rows.numel()))
    log_masses = [values.clamp(min=floor).log() for values in label_masses(layer, embedded[rows])]
    count = weights.count
    head = weights.head_labels.to(log_masses[0].device)
    thresholds, false_counts = rank_thresholds(layer, embedded[rows].to(_input_dtype(layer)))
    if fit_ids.numel() > 2:
        ids = fit_ids.to(log_masses[0].device)
        common = log_masses[1][ids].mean()
        per_label = torch.stack([*(v[ids] for v in log_masses), *false_counts[:, ids]], dim=1)
        nearest = nearest_log_masses(embedded[fit_rows], per_label, embedded[:count])
        mass, false_positive, allowed = nearest[:, 0], nearest[:, 1], nearest[:, 2:]
        # Head rows: the trained labels' mean level plus a damped part of each label's own (`HEAD_LEVEL_SPREAD`).
        false_positive[head] = common + HEAD_LEVEL_SPREAD * (false_positive[head] - common)
    else:
        mass, false_positive = (v.median().expand(count) for v in log_masses)
        allowed = false_counts.median(dim=1).values.expand(count, -1)
    allowed = RANK_CAP_FACTOR * allowed
    with_examples = examples is not None and examples[0].numel()
    if with_examples:
        example_rows, example_labels = examples
        branch_x = tuple(features.get(branch) for branch in ("head", "tail"))
        density = (mass.exp() / rows.numel()).clamp(1e-7, 0.5)
        order = example_labels.argsort()
        example_rows, example_labels = example_rows[order], example_labels[order]
        bounds = torch.searchsorted(example_labels, torch.arange(count + 1, device=example_labels.device)).tolist()
    # Scored a chunk of new labels at a time: every label's scores on the reference at once were 16 GB in float64
    # at 10^6 new labels; a chunk holds about 2^24 of them.
    chunk = max(1, min(LABEL_CHUNK, (1 << 24) // max(rows.numel(), 1)))
    offsets = torch.zeros(count, dtype=torch.float64, device=false_positive.device)
    for start in range(0, count, chunk):
        labels = torch.arange(start, min(start + chunk, count), device=weights.kind.device)
        end = start + labels.numel()
        scores = weights.logits_of(*inputs, labels).double()
        solved = solve_offsets(
            lambda columns, scores=scores: (scores[:, columns], 1.0), false_positive[start:end].double()
        )
        if with_examples and bounds[end] > bounds[start]:
            pairs = slice(bounds[start], bounds[end])
            example_scores = weights.pair_logits(*branch_x, example_rows[pairs], example_labels[pairs])
            local = example_labels[pairs] - start
            balanced = balanced_offsets(scores, example_scores, local, density[start:end])
            solved = torch.where(
                torch.bincount(local, minlength=labels.numel()).to(solved.device) > 0, balanced, solved
            )
        offsets[start:end] = solved - rank_caps(scores + solved, thresholds, allowed[start:end])
    weights.add_offsets(offsets)


__all__ = [
    "balanced_offsets",
    "RidgeFitter",
    "RidgeMap",
    "StartingWeights",
    "calibrate_new_labels",
    "blended_map",
    "distilled_blend",
    "reference_rows",
    "fallback_start",
    "fit_new_labels",
    "mapped_weights",
    "label_masses",
    "map_labels",
    "solve_offsets",
    "head_map_targets",
    "tail_label_positions",
    "tail_weights_at",
    "nearest_log_masses",
]
