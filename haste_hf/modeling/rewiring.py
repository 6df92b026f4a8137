# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Rewiring of the group-shared sparse tail: prune the weakest (group, slot) pairs, regrow them elsewhere.

Group ``k`` of the tail owns the feature indices ``supports[k]`` (``F`` distinct values in ``[0, d)``)
and its ``G`` labels own the weights ``weight[k, :, :]``. One rewiring step (HASTE, algorithm
"Group-Shared Rewiring"):

1. score every (group, slot) pair by the mean ``|w|`` of the slot over the group's (valid) labels
   (``score="label_normalized"``: each label's ``|w|`` divided first by its own mean ``|w|`` over the group's
   slots, so that a label seen once, whose weights stay small, has as much say in its group's support as one
   seen a thousand times);
2. prune the weakest ``floor(K * F * fraction)`` pairs over the whole tail (``scope="global"``) or the
   weakest ``floor(F * fraction)`` slots of every group (``scope="group"``);
3. give each pruned slot a random feature index that its group does not hold and that differs from the
   index it just lost, and reset the slot's weights of all ``G`` labels (zero or
   ``Uniform(-1/sqrt(F), 1/sqrt(F))``).

`rewire_` is a pure function of its inputs and of ``(seed, step)``: the random stream comes from a CPU
generator seeded by a hash of the two, so every data-parallel rank, and a run resumed from a checkpoint,
rewires identically without any saved state. Ties between equal scores go to the lowest
``(group, slot)``. On another device type the floating-point sums behind the scores may round
differently, so CPU and CUDA agree exactly only where no two scores come within rounding of each other.
"""

import hashlib
import math
from dataclasses import dataclass

import torch

from .sparse_ops import chunks


# Upper bound on the elements of the transient blocks (fp32 |weight| rows, gathered supports, random
# initial weights), so rewiring a tail with millions of labels needs tens of MB of scratch, not GBs.
_CHUNK_ELEMENTS = 1 << 22

SCOPES = ("global", "group")
# Rewirings of a run whose interval is not given: the lever study found no gain from more (or from none) on real
# data, and a count, unlike an interval, fits runs of every length.
DEFAULT_REWIRINGS = 6
INITS = ("zero", "random")
SCORES = ("mean_abs", "label_normalized")


@dataclass(frozen=True)
class RewiringResult:
    """What one rewiring step changed: pruned pair ``i`` is slot ``slots[i]`` of group ``groups[i]``.

    Pairs are sorted by ``(group, slot)``. ``old_features[i]`` is the feature index the slot lost and
    ``new_features[i]`` the one it gained; all tensors live on the device of the tail.
    """

    groups: torch.Tensor
    slots: torch.Tensor
    old_features: torch.Tensor
    new_features: torch.Tensor
    num_groups: int
    fan_in: int

    @property
    def count(self) -> int:
        return self.groups.numel()

    @property
    def mask(self) -> torch.Tensor:
        """Bool ``[K, F]``, True at the rewired (group, slot) pairs."""
        mask = torch.zeros(self.num_groups, self.fan_in, dtype=torch.bool, device=self.groups.device)
        mask[self.groups, self.slots] = True
        return mask


def default_rewiring_interval(max_steps: int, end_fraction: float, rewirings: int = DEFAULT_REWIRINGS) -> int:
    """The interval that spreads `rewirings` rewirings evenly over the first `end_fraction` of `max_steps`, the last
    one at its end."""
    return max(1, int(max_steps * end_fraction) // rewirings)


def rewiring_seed(seed: int, step: int) -> int:
    """The generator seed of the rewiring at ``step`` of a run seeded with ``seed`` (stable across processes)."""
    digest = hashlib.blake2b(f"haste_hf.rewiring:{seed}:{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def check_rewiring_options(
    fraction: float,
    scope: str,
    init: str,
    end_fraction: float | None = None,
    *,
    names: dict[str, str] | None = None,
    zero_fraction_ok: bool = False,
    score: str = "mean_abs",
) -> None:
    """Raises a ValueError naming the offending argument, with its caller's name (``names`` maps
    ``"fraction"``, ``"scope"``, ``"init"``, ``"end_fraction"`` to it). A rewiring step may prune
    nothing (``zero_fraction_ok``); a rewiring schedule must prune something."""
    names = {
        "fraction": "fraction",
        "scope": "scope",
        "init": "init",
        "end_fraction": "end_fraction",
        "score": "score",
        **(names or {}),
    }
    above_lower_end = fraction >= 0.0 if zero_fraction_ok else fraction > 0.0
    if not (above_lower_end and fraction <= 1.0):
        interval = "[0, 1]" if zero_fraction_ok else "(0, 1]"
        raise ValueError(f"`{names['fraction']}` must lie in {interval}, got {fraction}.")
    if end_fraction is not None and not 0.0 <= end_fraction <= 1.0:
        raise ValueError(f"`{names['end_fraction']}` must lie in [0, 1], got {end_fraction}.")
    if scope not in SCOPES:
        raise ValueError(f"`{names['scope']}` must be one of {SCOPES}, got {scope!r}.")
    if init not in INITS:
        raise ValueError(f"`{names['init']}` must be one of {INITS}, got {init!r}.")
    if score not in SCORES:
        raise ValueError(f"`{names['score']}` must be one of {SCORES}, got {score!r}.")


def num_pairs_to_prune(num_pairs: int, fraction: float) -> int:
    """``floor(num_pairs * fraction)``, robust to binary rounding (0.29 * 100 gives 29, not 28)."""
    return math.floor(round(num_pairs * fraction, 6))


def group_slot_scores(
    weight: torch.Tensor, label_mask: torch.Tensor | None = None, score: str = "mean_abs"
) -> torch.Tensor:
    """Float32 ``[K, F]``: mean ``|weight[k, g, j]|`` over the labels ``g`` of group ``k`` that
    ``label_mask[k, g]`` marks valid (all labels when ``label_mask`` is None). ``score="label_normalized"``:
    each label's ``|weight[k, g, :]|`` divided by its mean first (an all-zero label counts zero)."""
    num_groups, group_size, fan_in = weight.shape
    if label_mask is not None:
        if label_mask.shape != (num_groups, group_size) or label_mask.dtype != torch.bool:
            raise ValueError(
                f"`label_mask` must be a bool tensor of shape [groups, group_size] = {(num_groups, group_size)}, "
                f"got {label_mask.dtype} of shape {tuple(label_mask.shape)}."
            )
        label_mask = label_mask.to(weight.device)
        labels_per_group = label_mask.sum(dim=1)
        if bool((labels_per_group == 0).any()):
            empty = int(torch.nonzero(labels_per_group == 0)[0])
            raise ValueError(f"`label_mask` marks no valid label in group {empty}; every group needs at least one.")
    scores = torch.empty(num_groups, fan_in, dtype=torch.float32, device=weight.device)
    for rows in chunks(num_groups, group_size * fan_in, _CHUNK_ELEMENTS):
        block = weight[rows].detach().abs().float()
        if score == "label_normalized":
            block /= block.mean(dim=2, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        if label_mask is None:
            scores[rows] = block.mean(dim=1)
        else:
            block.mul_(label_mask[rows].unsqueeze(-1))
            scores[rows] = block.sum(dim=1) / labels_per_group[rows].unsqueeze(-1)
    return scores


def _select_weakest(scores: torch.Tensor, fraction: float, scope: str) -> torch.Tensor:
    """Flat indices ``k * F + j`` of the pairs to prune, ascending. Stable sorts make ties deterministic."""
    num_groups, fan_in = scores.shape
    if scope == "global":
        count = num_pairs_to_prune(num_groups * fan_in, fraction)
        weakest = torch.sort(scores.flatten(), stable=True).indices[:count]
    else:
        per_group = num_pairs_to_prune(fan_in, fraction)
        slots = torch.sort(scores, dim=1, stable=True).indices[:, :per_group]
        groups = torch.arange(num_groups, device=scores.device).unsqueeze(1)
        weakest = (groups * fan_in + slots).flatten()
    return torch.sort(weakest).values


def _rows_contain(supports: torch.Tensor, groups: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Bool ``[n]``: whether ``supports[groups[i]]`` holds ``candidates[i]``; O(n * F) work in bounded blocks."""
    found = torch.empty_like(groups, dtype=torch.bool)
    for block in chunks(groups.numel(), supports.shape[1], _CHUNK_ELEMENTS):
        rows = supports[groups[block]]
        found[block] = (rows == candidates[block].unsqueeze(1).to(rows.dtype)).any(1)
    return found


def _first_of_duplicates(keys: torch.Tensor) -> torch.Tensor:
    """Bool mask keeping the first occurrence (in order) of every distinct value of ``keys``."""
    order = torch.sort(keys, stable=True).indices
    sorted_keys = keys[order]
    first_sorted = torch.ones_like(sorted_keys, dtype=torch.bool)
    first_sorted[1:] = sorted_keys[1:] != sorted_keys[:-1]
    first = torch.empty_like(first_sorted)
    first[order] = first_sorted
    return first


def _regrow_(
    supports: torch.Tensor,
    groups: torch.Tensor,
    slots: torch.Tensor,
    old_features: torch.Tensor,
    num_features: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """Fill the pruned slots with new distinct indices, all slots at once; returns the new indices.

    Each round draws one candidate for every slot still open, rejects those the group already holds
    (kept slots and slots filled in earlier rounds), those equal to the slot's old index, and all but the
    first of equal candidates within a group; the rest are written into ``supports``. A slot always has
    at least ``d - F >= 1`` admissible values, so the loop ends.
    """
    supports[groups, slots] = -1  # open slots hold no feature while the group's remaining ones are checked
    new_features = torch.empty_like(old_features)
    open_slots = torch.arange(groups.numel(), device=groups.device)
    while open_slots.numel() > 0:
        candidates = torch.randint(0, num_features, (open_slots.numel(),), generator=generator)
        candidates = candidates.to(groups.device)
        open_groups = groups[open_slots]
        admissible = ~_rows_contain(supports, open_groups, candidates) & (candidates != old_features[open_slots])
        admissible_positions = torch.nonzero(admissible).squeeze(1)
        keys = open_groups[admissible_positions] * num_features + candidates[admissible_positions]
        accepted = admissible_positions[_first_of_duplicates(keys)]
        filled = open_slots[accepted]
        supports[groups[filled], slots[filled]] = candidates[accepted].to(supports.dtype)
        new_features[filled] = candidates[accepted].to(new_features.dtype)
        still_open = torch.ones_like(open_slots, dtype=torch.bool)
        still_open[accepted] = False
        open_slots = open_slots[still_open]
    return new_features


def reset_pruned_weights_(weight, groups, slots, init: str, generator: torch.Generator, first_group: int = 0) -> None:
    """Reset the weights of the pruned pairs ``(groups[i], slots[i])`` that fall in this ``weight``, which
    holds groups ``first_group ..`` of the tail (a shard of it, or all of it). Random values are drawn for
    every pair of the whole tail in the same order whichever share is held, so each shard gets the values
    the unsharded tail would."""
    local = (groups >= first_group) & (groups < first_group + weight.shape[0])
    if init == "zero":
        weight[groups[local] - first_group, :, slots[local]] = 0
        return
    group_size, fan_in = weight.shape[1], weight.shape[2]
    bound = 1.0 / math.sqrt(fan_in)
    for block in chunks(groups.numel(), group_size, _CHUNK_ELEMENTS):
        values = torch.empty(groups[block].numel(), group_size).uniform_(-bound, bound, generator=generator)
        keep = local[block]
        weight[groups[block][keep] - first_group, :, slots[block][keep]] = values[keep.cpu()].to(
            device=weight.device, dtype=weight.dtype
        )


def check_supports(supports: torch.Tensor, num_groups: int, fan_in: int, num_features: int) -> None:
    if supports.shape != (num_groups, fan_in) or supports.is_floating_point():
        raise ValueError(
            f"`supports` must be an integer tensor of shape [groups, fan_in] = {(num_groups, fan_in)}, "
            f"got {supports.dtype} of shape {tuple(supports.shape)}."
        )
    if supports.numel() > 0 and (int(supports.min()) < 0 or int(supports.max()) >= num_features):
        raise ValueError(
            f"`supports` holds indices outside [0, num_features={num_features}); pass the tail's input width."
        )


def regrow_weakest_(
    scores: torch.Tensor, supports: torch.Tensor, num_features: int, fraction: float, scope: str, seed: int, step: int
):
    """Steps 2 and 3 of a rewiring on the whole tail's ``scores`` and ``supports`` ``[K, F]`` (``supports``
    changed in place): returns ``(groups, slots, old_features, new_features, generator)``, the generator
    positioned where `reset_pruned_weights_` draws from."""
    fan_in = scores.shape[1]
    pruned = _select_weakest(scores, fraction, scope)
    groups, slots = pruned // fan_in, pruned % fan_in
    old_features = supports[groups, slots]
    if pruned.numel() > 0 and fan_in >= num_features:
        raise ValueError(
            f"Cannot rewire: fan_in F={fan_in} equals num_features d={num_features}, so every group already "
            "holds every feature. Disable rewiring (fraction=0) or use a wider tail input."
        )
    generator = torch.Generator().manual_seed(rewiring_seed(seed, step))
    new_features = _regrow_(supports, groups, slots, old_features, num_features, generator)
    return groups, slots, old_features, new_features, generator


@torch.no_grad()
def rewire_(
    weight: torch.Tensor,
    supports: torch.Tensor,
    num_features: int,
    fraction: float,
    scope: str = "global",
    init: str = "zero",
    seed: int = 0,
    step: int = 0,
    label_mask: torch.Tensor | None = None,
    score: str = "mean_abs",
) -> RewiringResult:
    """Rewire the tail ``(weight [K, G, F], supports [K, F])`` in place and return what changed.

    Args:
        weight: the tail weights ``[K, G, F]`` (a parameter; modified under ``no_grad``).
        supports: the integer feature indices ``[K, F]`` of every group, distinct per row, in
            ``[0, num_features)``.
        num_features: ``d``, the width of the features the tail reads; must exceed ``F``.
        fraction: share of pairs to prune, in ``[0, 1]``.
        scope: ``"global"`` prunes the ``floor(K * F * fraction)`` weakest pairs of the whole tail,
            ``"group"`` the ``floor(F * fraction)`` weakest slots of every group.
        init: new weights of the rewired slots, ``"zero"`` or ``"random"``
            (``Uniform(-1/sqrt(F), 1/sqrt(F))``).
        seed, step: the random stream is a function of these two only.
        label_mask: optional bool ``[K, G]``, False at padding labels (kept out of the scores).
        score: ``"mean_abs"`` (the paper) or ``"label_normalized"``, see `group_slot_scores`.

    Also reset the optimizer state of the rewired slots: `reset_optimizer_state_`.
    """
    if weight.dim() != 3:
        raise ValueError(f"`weight` must be 3-D [groups, group_size, fan_in], got shape {tuple(weight.shape)}.")
    num_groups, _, fan_in = weight.shape
    if supports.device != weight.device:
        raise ValueError(f"`supports` ({supports.device}) and `weight` ({weight.device}) must be on one device.")
    check_rewiring_options(fraction, scope, init, zero_fraction_ok=True, score=score)
    check_supports(supports, num_groups, fan_in, num_features)
    scores = group_slot_scores(weight, label_mask, score)
    groups, slots, old_features, new_features, generator = regrow_weakest_(
        scores, supports, num_features, fraction, scope, seed, step
    )
    reset_pruned_weights_(weight, groups, slots, init, generator)
    return RewiringResult(groups, slots, old_features, new_features, num_groups, fan_in)


def _param_state(optimizer, param: torch.Tensor) -> dict | None:
    """The optimizer state of ``param``, looking through wrappers (accelerate, `HasteOptimizer`) that
    expose the state of the optimizer they hold; None while the param has no state yet."""
    if not any(p is param for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(
            "`weight` is not among the parameters of `optimizer`; pass the optimizer that updates the tail."
        )
    return optimizer.state.get(param)  # `get`: reading the defaultdict must not add an entry


@torch.no_grad()
def reset_optimizer_state_(optimizer, weight: torch.Tensor, rewired: RewiringResult | torch.Tensor) -> int:
    """Zero the optimizer state (momentum, Adam moments, ...) of the rewired slots ``[k, :, j]`` of ``weight``.

    ``rewired`` is a `RewiringResult` or a bool ``[K, F]`` mask. Every state tensor shaped like ``weight``
    is reset, scalars such as ``step`` are left alone. Returns the number of state tensors reset.
    """
    if isinstance(rewired, RewiringResult):
        groups, slots = rewired.groups, rewired.slots
    else:
        if rewired.shape != (weight.shape[0], weight.shape[2]) or rewired.dtype != torch.bool:
            raise ValueError(
                f"`rewired` must be a RewiringResult or a bool mask [groups, fan_in] = {(weight.shape[0], weight.shape[2])}, "
                f"got {rewired.dtype} of shape {tuple(rewired.shape)}."
            )
        groups, slots = torch.nonzero(rewired, as_tuple=True)
    state = _param_state(optimizer, weight)
    if state is None:
        return 0
    reset = 0
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.shape == weight.shape:
            value[groups.to(value.device), :, slots.to(value.device)] = 0
            reset += 1
    return reset
