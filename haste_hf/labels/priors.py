# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What a trained model knows about labels it never saw: the map from a label's text to its weights, and the score
level a label of its expected frequency has. `additions.py` places and fits the new labels with them.

The text map. A trained label's weights on a branch (the head's row and bias; the tail's F weights scattered onto
the branch's features, zero off its support, and its bias where the tail has one) are a function of its text that
training found. A ridge regression from the pooled features of the trained labels' texts to those weights learns
it; its penalty is the one of a small grid with the least leave-one-out error (closed form from one SVD). A new
label's weights are the map of its text: a mix of the trained labels' weights whose texts resemble its own, which
lands on the scale and in the subspace where the trained labels' scores live, instead of the text's own embedding.

The calibration. A label's scores over the texts the model reads have a level set by its frequency. Training with
BCE leaves each trained label's bias where the gradient of its loss in the bias vanishes: its sigmoid scores summed
over the training texts equal the number of them that carry it. A new label's bias is set by the same condition on
the texts whose truth is known for it, where there are some:

- With negatives (training texts tagged with none of the new labels) its known texts are its positives (its own
  text and its examples) and the negatives, and the offset makes its scores summed over them its positives' count
  (`balanced_offsets`). The negatives carry none of the new labels: the mass they get is the label's false
  positives, balanced against the mass its positives miss, not a positive mass the label is expected to have (an
  earlier version set a new label's mass on the negatives alone to a trained label's mass there, which counts the
  trained label's positives among them, and so made every new label fire on the negatives by construction).
- Without negatives the known texts are a sample of the trained labels' texts (the model's label names), none of
  which carries a new label, and the trained labels fitted there are the other half of the names, none of which
  carries them either: both sides are false-positive masses. Each trained label's mass on that sample is measured,
  the same ridge map predicts a new label's log-mass from its text, and an offset makes its mass what the map
  predicts (`calibrate`).

Offsets are solved per label by a few vectorised Newton steps on the log of the mass. The offset is the label's
bias: a tail trained without bias (the default) gains one when labels are added, zero for the existing labels,
whose scores stay bit-identical (`x + 0.0 == x`). (The level could instead ride on the weights along the features'
mean, but MiniLM's features have no direction of near-constant projection: such an offset would add noise of a
third of itself to every score.)
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers.utils.logging import is_progress_bar_enabled


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
# Factors tried on the mapped tail weights (`distilled_scale`), on this many trained labels held out of the map.
SCALES = tuple(2.0 ** (step / 2) for step in range(-6, 7))
SCALE_LABELS = 256


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
def tail_weights_by_label(layer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`(labels, weights [n, F], supports [n, F])` of every tail label, and their biases `[n]` (None without)."""
    first = layer.tail_first_position
    ids = layer.output_labels[first:]
    valid = ids >= 0
    weights = layer.tail.weight.float().flatten(0, 1)[valid]
    supports = layer.tail.supports.long().repeat_interleave(layer.group_size, dim=0)[valid]
    bias = None if layer.tail.bias is None else layer.tail.bias.float()[valid]
    return ids[valid], weights, supports, bias


@torch.no_grad()
def label_masses(layer, reference: torch.Tensor) -> torch.Tensor:
    """`[label_count]` each trained label's mass on the reference features `[n, d]`: the sum of its sigmoid scores,
    scored a few texts at a time (about 2^27 scores a chunk)."""
    mass = torch.zeros(layer.label_count, dtype=torch.float64, device=reference.device)
    chunk = max(1, (1 << 27) // max(layer.label_count, 1))
    for start in range(0, reference.shape[0], chunk):
        logits = layer.logits(reference[start : start + chunk].to(_input_dtype(layer)))
        mass += torch.sigmoid(logits.float()).sum(dim=0).double()
    return mass


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


def target_log_masses(text_map: RidgeMap, texts: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """The log-mass the map predicts for each text, kept within the trained labels' range `known`."""
    predicted = text_map(texts).squeeze(1)
    return predicted.clamp(float(known.min()), float(known.max()))


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
def mapped_weights(layer, branch, new_x, label_x, label_ids, reference_tail: torch.Tensor | None = None):
    """The `StartingWeights` of texts `new_x` `[count, d]` on `branch`, from the ridge map fitted on the trained
    labels `label_ids` whose texts are `label_x`; None when the branch holds fewer than 2 of them. The tail's scale
    is distilled on the tail inputs `reference_tail` of reference texts (`distilled_scale`) where given."""
    positions = layer.label_positions.to(label_ids.device)[label_ids]
    if branch == "head":
        rows = positions < layer.head_label_count
        if int(rows.sum()) < 2:
            return None
        head_rows = positions[rows]
        targets = [layer.head.weight.float()[head_rows]]
        if layer.head.bias is not None:
            targets.append(layer.head.bias.float()[head_rows].unsqueeze(1))
        predicted = RidgeFitter(label_x[rows]).fit(torch.cat(targets, dim=1))(new_x).float()
        width = layer.head.weight.shape[1]
        return StartingWeights(predicted[:, :width], predicted[:, width] if len(targets) > 1 else None)
    ids, weights, supports, bias = tail_weights_by_label(layer)
    row_of = torch.full((layer.label_count,), -1, dtype=torch.int64, device=ids.device)
    row_of[ids] = torch.arange(ids.numel(), device=ids.device)
    in_tail = row_of[label_ids.to(ids.device)] >= 0
    if int(in_tail.sum()) < 2:
        return None
    rows = row_of[label_ids.to(ids.device)][in_tail]
    texts = label_x[in_tail.to(label_x.device)]
    width = layer.tail.in_features
    dense = torch.zeros(rows.numel(), width, device=weights.device).scatter_(1, supports[rows], weights[rows])
    targets = dense if bias is None else torch.cat([dense, bias[rows].unsqueeze(1)], dim=1)
    predicted = RidgeFitter(texts).fit(targets)(new_x).float()
    if reference_tail is not None and rows.numel() >= 8:
        scale = distilled_scale(texts, targets, rows, (weights, supports, bias), reference_tail)
    else:  # the dense map spreads a label's weight over every feature: the trained labels' norm on the support
        scale = float(weights[rows].norm(dim=1).mean() / predicted[:, :width].norm(dim=1).mean().clamp(min=1e-12))
    return StartingWeights(predicted[:, :width], predicted[:, width] if bias is not None else None, scale=scale)


@torch.no_grad()
def distilled_scale(texts, targets, rows, tail, reference: torch.Tensor) -> float:
    """The factor on mapped tail weights under which they best reproduce trained labels' probabilities: labels held
    out of a second map, their mapped weights times each of `SCALES` (with the bias that matches their mass) scored
    on the `reference` tail inputs `[n, d_tail]`, against the sigmoid of their trained scores (cross-entropy). A map
    from text knows less than training did; its weights at full norm would be surer of themselves than they know."""
    weights, supports, bias = tail
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(rows.numel(), generator=generator).to(rows.device)
    held, rest = order[: min(SCALE_LABELS, rows.numel() // 4)], order[min(SCALE_LABELS, rows.numel() // 4) :]
    width = reference.shape[1]
    guess = RidgeFitter(texts[rest]).fit(targets[rest])(texts[held]).float()[:, :width]
    held_rows = rows[held]
    gathered = reference[:, supports[held_rows]]  # [n, h, F]
    guessed = torch.einsum("nhf,hf->nh", gathered, guess.gather(1, supports[held_rows])).double()
    trained = torch.einsum("nhf,hf->nh", gathered, weights[held_rows])
    probabilities = torch.sigmoid(trained + (0 if bias is None else bias[held_rows])).double()
    target = probabilities.sum(dim=0).clamp(min=1e-6).log()
    best = None
    for scale in SCALES:
        offsets = solve_offsets(lambda labels, scale=scale: (scale * guessed[:, labels], 1.0), target)
        z = scale * guessed + offsets
        loss = -(probabilities * F.logsigmoid(z) + (1 - probabilities) * F.logsigmoid(-z)).sum().item()
        if best is None or loss < best[0]:
            best = (loss, scale)
    return best[1]


@torch.no_grad()
def calibrate(weights, reference: tuple, target_log_mass: torch.Tensor) -> None:
    """Offsets the biases of the `NewLabelWeights` so that each new label's mass on the `reference` branch inputs
    `(head_x, tail_x)` is `exp(target_log_mass)`."""
    scores = weights.logits(*reference).double()
    offsets = solve_offsets(lambda labels: (scores[:, labels], 1.0), target_log_mass.double())
    weights.add_offsets(offsets)


@torch.no_grad()
def balanced_offsets(
    negative_scores: torch.Tensor,
    positive_scores: torch.Tensor,
    positive_labels: torch.Tensor,
    steps: int = NEWTON_STEPS,
) -> torch.Tensor:
    """`[m]` the offset `beta` of each label at which the BCE gradient of its bias vanishes on the texts whose truth
    is known for it: `sum_pos sigmoid(a + beta) + sum_neg sigmoid(b + beta) = n_pos`, its scores summed over its
    known texts equal to how many of them carry it, where `negative_scores` `[n_neg, m]` are the labels' scores on
    the negatives and `positive_scores` `[k]` the score of label `positive_labels[i]` on one of its positives.
    Newton on the log of the left side, as `solve_offsets`."""
    count = negative_scores.shape[1]
    negative_scores, positive_scores = negative_scores.double(), positive_scores.double()
    target = torch.bincount(positive_labels, minlength=count).clamp(min=1).double().log().to(negative_scores.device)
    beta = torch.zeros(count, dtype=torch.float64, device=negative_scores.device)
    for _ in range(steps):
        negative, positive = negative_scores + beta, positive_scores + beta[positive_labels]
        # log sigmoid and log (1 - sigmoid) of the scores on the negatives, then on each label's positives grouped
        up, down = F.logsigmoid(negative), F.logsigmoid(-negative)
        up_positive, down_positive = F.logsigmoid(positive), F.logsigmoid(-positive)
        log_mass = torch.logsumexp(torch.cat([up, _scatter_logsumexp(up_positive, positive_labels, count)]), dim=0)
        log_slope = torch.logsumexp(
            torch.cat([up + down, _scatter_logsumexp(up_positive + down_positive, positive_labels, count)]), dim=0
        )
        beta = beta - ((log_mass - target) / torch.exp(log_slope - log_mass).clamp(min=1e-9)).clamp(-4.0, 4.0)
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


def fit_new_labels(
    weights,
    positives: tuple[torch.Tensor | None, torch.Tensor | None],
    pairs: tuple[torch.Tensor, torch.Tensor],
    negatives: tuple[torch.Tensor | None, torch.Tensor | None],
    *,
    steps: int,
    learning_rate: float,
    prior_strength: float = DEFAULT_PRIOR_STRENGTH,
) -> list[float]:
    """Adam on the new weights alone: a MAP logistic fit per new label, the mean BCE of its positive pairs plus the
    mean BCE over the negatives, plus `prior_strength / 2` times the squared distance of its weights from where
    they started (the text's), relative to their mean squared norm, so that a few examples move a label from its
    text's weights without forgetting them. Its level is calibrated afterwards, so the balance of positives and
    negatives sets the direction alone. Returns the loss of each step."""
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
    _, trained, _, bias = tail_weights_by_label(layer)
    bias = None if bias is None else bias.mean().expand(direction.shape[0])
    return StartingWeights(direction, bias, norm=float(trained.norm(dim=1).mean()))


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


def calibrate_new_labels(layer, weights, embedded, features, reference, count, positives=None) -> None:
    """The new labels' levels; left as they start where there is no reference. With `positives` `(rows, labels)`
    (the reference rows are then the negatives), each label's bias is the one at which its BCE on its positives and
    the negatives is stationary (`balanced_offsets`); without, its mass on the `reference` rows (`reference_rows`)
    is the one its text predicts (`calibrate`)."""
    if reference is None:
        return
    rows, fit_rows, fit_ids = reference
    inputs = tuple(None if x is None else x[rows] for x in (features.get("head"), features.get("tail")))
    if positives is not None:
        positive_rows, positive_labels = positives
        branch_x = tuple(features.get(branch) for branch in ("head", "tail"))
        positive_scores = weights.pair_logits(*branch_x, positive_rows, positive_labels)
        weights.add_offsets(balanced_offsets(weights.logits(*inputs), positive_scores, positive_labels))
        return
    masses = label_masses(layer, embedded[rows])
    log_masses = masses.clamp(min=math.exp(log_mass_floor(rows.numel()))).log()
    if fit_ids.numel() > 2:
        known = log_masses[fit_ids.to(log_masses.device)]
        text_map = RidgeFitter(embedded[fit_rows]).fit(known.unsqueeze(1))
        target = target_log_masses(text_map, embedded[:count], known)
    else:
        target = log_masses.median().expand(count)
    calibrate(weights, inputs, target)


__all__ = [
    "RidgeFitter",
    "RidgeMap",
    "StartingWeights",
    "balanced_offsets",
    "calibrate",
    "calibrate_new_labels",
    "distilled_scale",
    "reference_rows",
    "fallback_start",
    "fit_new_labels",
    "mapped_weights",
    "label_masses",
    "map_labels",
    "solve_offsets",
    "tail_weights_by_label",
    "target_log_masses",
]
