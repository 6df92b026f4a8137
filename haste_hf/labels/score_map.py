# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The head's score map for labels added to a trained model: from a new head row's levelled logit (`priors.py`) to
the logit training would have given it, learnt at add time on trained labels mapped from their texts and levelled
as a new label is (`head_score_calibration`); `priors.calibrate_new_labels` applies it."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .priors import (
    HEAD_LEVEL_SPREAD,
    RidgeFitter,
    _input_dtype,
    blended_map,
    branch_copies,
    head_map_targets,
    nearest_log_masses,
    solve_offsets,
)


# Trained labels mapped by a head map fitted without them, to learn the head's score map on.
CALIBRATION_LABELS = 512
CALIBRATION_STEPS = 25


@dataclass
class HeldOutPredictions:
    """A `RidgeMap`'s stand-in for `blended_map`: the map's predictions of some labels, fitted without them."""

    values: torch.Tensor
    target_mean: torch.Tensor

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.values


@torch.no_grad()
def trained_logits(layer, reference: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`[n, m]` float64 the trained logits of `labels` on the reference features `[n, d]`, a few texts at a time
    (about 2^27 scores a chunk, as `label_masses`)."""
    chunk = max(1, (1 << 27) // max(layer.label_count, 1))
    parts = []
    for start in range(0, reference.shape[0], chunk):
        logits = layer.logits(reference[start : start + chunk].to(_input_dtype(layer)))
        parts.append(logits[:, labels.to(logits.device)].double())
    return torch.cat(parts)


@torch.no_grad()
def fit_score_map(inputs: torch.Tensor, probabilities: torch.Tensor, steps: int = CALIBRATION_STEPS) -> torch.Tensor:
    """`[k]` the coefficients `w` of `sigmoid(inputs @ w)` (`inputs` `[N, k]`) with the least cross-entropy against
    the target `probabilities` `[N]`: Newton's method on a convex loss, its steps halved until the loss falls."""
    inputs, probabilities = inputs.double(), probabilities.double()

    def loss(w):
        z = inputs @ w
        return -(probabilities * F.logsigmoid(z) + (1 - probabilities) * F.logsigmoid(-z)).sum()

    w = torch.zeros(inputs.shape[1], dtype=torch.float64, device=inputs.device)
    w[0] = 1.0
    current = loss(w)
    for _ in range(steps):
        p = torch.sigmoid(inputs @ w)
        gradient = inputs.T @ (p - probabilities)
        hessian = (inputs * (p * (1 - p)).unsqueeze(1)).T @ inputs
        hessian += (
            1e-9 * hessian.diagonal().mean().clamp(min=1e-12) * torch.eye(w.numel(), dtype=w.dtype, device=w.device)
        )
        step = torch.linalg.solve(hessian, gradient)
        for _ in range(30):
            trial = loss(w - step)
            if trial <= current:
                w, current = w - step, trial
                break
            step = step / 2
    return w


@torch.no_grad()
def head_score_calibration(layer, label_x, label_ids, reference_x, log_fp_mass, blend, seed: int = 0):
    """`(scale, offset)`: the map `scale * z + offset` from a new head row's levelled logit `z` to the logit training
    would have given it, learnt at add time on `CALIBRATION_LABELS` trained labels (or all of the map's), each
    mapped from its text by a head map fitted without them (the copy at `blend`) and
    levelled as a new label is (`calibrate_new_labels`: its false-positive mass on the `reference_x` texts set to
    its nearest other labels' `log_fp_mass`, damped by `HEAD_LEVEL_SPREAD`): the least cross-entropy of
    `sigmoid(scale * z + offset)` against the trained model's probabilities on those texts (`fit_score_map`). The
    level alone matches a false-positive mass; how sure a mapped score may be, how far its true texts stand above
    the rest, only trained labels say. The map is increasing (a negative scale is refused: 0), so the new labels'
    order on a text stays the level's. At most half the map's labels are held out; None where it has fewer than 8."""
    positions = layer.label_positions.to(label_ids.device)[label_ids]
    rows, targets = head_map_targets(layer, label_ids, positions)
    if int(rows.sum()) < 8:
        return None
    rows = rows.to(label_x.device)
    texts, ids = label_x[rows], label_ids.to(rows.device)[rows]
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(texts.shape[0], generator=generator).to(texts.device)
    count = min(CALIBRATION_LABELS, texts.shape[0] // 2)
    sample, rest = order[:count], order[count:]
    copies = branch_copies(layer, texts, "head")
    width = layer.head.weight.shape[1]
    x = branch_copies(layer, reference_x, "head").double()
    trained = torch.sigmoid(trained_logits(layer, reference_x, ids[sample]))
    fitter = RidgeFitter(texts)
    text_map = fitter.fit(targets)
    # The sample's predictions by the map fitted without it, from the one fit on every label (a linear smoother's
    # hold-out identity, at the penalty chosen with them): `(I - H_ss)^-1 (fitted_s - H_ss y_s)`.
    shrink = fitter.s.square() / (fitter.s.square() + text_map.penalty)
    u = fitter.u[sample.to(fitter.u.device)]
    hat = (u * shrink) @ u.T + 1.0 / texts.shape[0]
    identity = torch.eye(count, dtype=hat.dtype, device=hat.device)
    held_targets = targets[sample].double().to(hat.device)
    held_out = torch.linalg.solve(identity - hat, text_map(texts[sample]) - hat @ held_targets)
    held_map = HeldOutPredictions(held_out, text_map.target_mean)
    guess = blended_map(held_map, copies[rest].mean(dim=0), blend)(texts[sample], copies[sample]).double()
    z = x @ guess[:, :width].T + (guess[:, width] if guess.shape[1] > width else 0.0)
    masses = log_fp_mass.to(ids.device)[ids[rest]]
    neighbours = nearest_log_masses(texts[rest], masses, texts[sample]).double().to(z.device)
    common = log_fp_mass.to(ids.device)[ids].mean().double()
    neighbours = common + HEAD_LEVEL_SPREAD * (neighbours - common)
    z = z + solve_offsets(lambda labels: (z[:, labels], 1.0), neighbours)
    inputs = torch.stack([z, torch.ones_like(z)], dim=-1).reshape(-1, 2)
    scale, offset = fit_score_map(inputs, trained.reshape(-1)).tolist()
    return max(scale, 0.0), offset


__all__ = ["HeldOutPredictions", "fit_score_map", "head_score_calibration", "trained_logits"]
