# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Trainer callbacks of HASTE training."""

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..modeling.logging_utils import get_logger
from ..modeling.rewiring import check_rewiring_options, default_rewiring_interval, reset_optimizer_state_
from .peft_utils import is_peft_model


logger = get_logger(__name__)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The user model inside DDP/FSDP (``.module``), ``torch.compile`` (``._orig_mod``) and PEFT
    (``get_base_model()``) wrappers."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif is_peft_model(model):
            model = model.get_base_model()
        else:
            return model


class RewiringCallback(TrainerCallback):
    """Rewires the sparse tail of a `HasteForExtremeClassification` during training.

    At every optimizer step ``s`` with ``s % interval == 0`` and ``s <= end_fraction * max_steps`` (``interval=None``:
    `DEFAULT_REWIRINGS` rewirings spread evenly over that window, `default_rewiring_interval`)
    (``on_step_end``: after the optimizer step and ``zero_grad``, before a checkpoint is saved), it runs
    the output layer's `rewire_` (`haste_hf.modeling.rewiring.rewire_` on its tail, or on every rank's share together)
    and zeroes the optimizer state (momentum) of the rewired slots. Padding slots of the last group are kept
    out of the scores.

    The callback holds no state: a rewiring is a function of the weights, ``seed`` and the global step,
    so all data-parallel ranks rewire identically (train with ``ddp_broadcast_buffers=False``) and a
    resumed run repeats the uninterrupted one. Each rewiring appends
    ``{"rewired_pairs": n, "step": s}`` to ``state.log_history``.

    Args:
        interval: optimizer steps between rewirings (the paper: 1,500-5,000), or None for a count of rewirings.
        fraction: share of (group, slot) pairs pruned per rewiring (the paper: 0.15-0.25).
        end_fraction: last rewiring at or before this fraction of ``max_steps`` (the paper: ~2/3).
        scope: ``"global"`` (the paper) or ``"group"``, see `rewire_`.
        init: ``"zero"`` (the paper's default) or ``"random"`` initial weights of regrown slots.
        seed: seed of the random regrowth; None takes ``TrainingArguments.seed``.
        score: how a (group, slot) pair is scored: ``"mean_abs"`` (the paper) or ``"label_normalized"``, see
            `haste_hf.modeling.rewiring.group_slot_scores`.
    """

    def __init__(
        self,
        interval: int | None = None,
        fraction: float = 0.2,
        end_fraction: float = 2 / 3,
        scope: str = "global",
        init: str = "zero",
        seed: int | None = None,
        score: str = "mean_abs",
    ):
        if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
            raise ValueError(f"`interval` must be a positive integer number of steps (or None), got {interval!r}.")
        check_rewiring_options(fraction, scope, init, end_fraction, score=score)
        self.interval, self.fraction, self.end_fraction = interval, fraction, end_fraction
        self.scope, self.init, self.seed, self.score = scope, init, seed, score

    def check_model(self, model) -> None:
        """Raises a ValueError unless `model` has a sparse tail that can be rewired: one with a feature outside
        every group's support (fan-in below the tail's input width)."""
        model = unwrap_model(model)
        tail = getattr(getattr(model, "output_layer", None), "tail", None)
        if tail is None:
            raise ValueError(
                f"RewiringCallback needs a model with a sparse tail (`model.output_layer.tail`), got {type(model).__name__} "
                "without one; remove the callback for models without a tail."
            )
        fan_in = tail.weight.shape[-1]
        if fan_in >= tail.in_features:
            raise ValueError(
                f"The sparse tail cannot be rewired: its fan-in ({fan_in}) equals its input width ({tail.in_features}), "
                "so every group already reads every feature. Lower `fan_in`, raise `tail_projection_dim`, or turn "
                "rewiring off (`rewiring_interval=0`)."
            )

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.check_model(model)

    def interval_of(self, max_steps: int) -> int:
        return self.interval or default_rewiring_interval(max_steps, self.end_fraction)

    def should_rewire(self, global_step: int, max_steps: int) -> bool:
        return (
            global_step > 0
            and global_step % self.interval_of(max_steps) == 0
            and global_step <= self.end_fraction * max_steps
        )

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if not self.should_rewire(state.global_step, state.max_steps):
            return
        self.check_model(model)
        layer = unwrap_model(model).output_layer
        result, count = layer.rewire_(
            self.fraction,
            self.scope,
            self.init,
            args.seed if self.seed is None else self.seed,
            state.global_step,
            self.score,
        )
        if optimizer is not None:
            reset_optimizer_state_(optimizer, layer.tail.weight, result)
        state.log_history.append({"rewired_pairs": count, "step": state.global_step})
        # Log this step, so the count reaches the console and the logging integrations too.
        control.should_log = True
        logger.info("Step %d: rewired %d (group, slot) pairs of the sparse tail.", state.global_step, count)


NON_FINITE_ACTIONS = ("stop", "skip")


class NonFiniteGradientCallback(TrainerCallback):
    """Guards each optimizer step against divergence: a NaN or infinite gradient (from a non-finite loss,
    an overflowing weight or a NaN in the encoder's output) either stops training with a
    `FloatingPointError` (`action="stop"`) or drops the update (`"skip"`: gradients are cleared, so
    neither optimizer moves its weights or momentum; the schedules still advance). Skipped steps are
    counted in `skipped_steps` (those of the current `train` call, reported at its end). A skip is refused
    when the weights themselves are no longer finite, since no later step could recover from that; and
    `HasteTrainer.train` fails when more than half of its steps were skipped (`too_many_skipped`).

    One device sync per optimizer step: the largest absolute gradient of each tensor is gathered and
    tested at once (the max, unlike the norm, never overflows on large finite gradients). Under several
    processes the verdict is agreed by all (one tiny all-reduce), so that every rank stops or skips
    together, a sharded output layer's shares included.
    """

    def __init__(self, action: str = "stop"):
        if action not in NON_FINITE_ACTIONS:
            raise ValueError(f"`on_non_finite` must be one of {NON_FINITE_ACTIONS}, got {action!r}.")
        self.action = action
        self.skipped_steps = 0
        self.steps = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.skipped_steps, self.steps, self._first_step = 0, 0, state.global_step

    def on_train_end(self, args, state, control, **kwargs):
        self.steps = state.global_step - self._first_step
        if self.skipped_steps:
            logger.warning(
                "%d of %d optimizer steps were skipped: their gradients were NaN or infinite.",
                self.skipped_steps,
                self.steps,
            )

    @property
    def too_many_skipped(self) -> bool:
        """Whether more than half of the steps of the last `train` call were skipped: the run diverged."""
        return 2 * self.skipped_steps > self.steps

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        parameters = [param for param in unwrap_model(model).parameters() if param.grad is not None]
        if _on_every_rank(all_finite([param.grad for param in parameters]), args.device):
            return
        step = state.global_step + 1
        if self.action == "stop":
            raise FloatingPointError(
                f"Training diverged at step {step}: the loss or gradients are NaN or infinite. Lower the "
                "learning rates (encoder and output layer), check the data and the encoder's outputs, or "
                "set `on_non_finite='skip'` (CLI: --on-non-finite skip) to skip such steps."
            )
        if not _on_every_rank(all_finite(parameters), args.device):
            raise FloatingPointError(
                f"Training diverged at step {step}: the weights themselves are NaN or infinite, so skipping "
                "steps cannot recover. Lower the learning rates."
            )
        self.skipped_steps += 1
        logger.warning(
            "Step %d skipped: its gradients are NaN or infinite (%d skipped so far).", step, self.skipped_steps
        )
        for param in parameters:
            param.grad = None


def _on_every_rank(holds: bool, device) -> bool:
    """Whether `holds` is true on every process of the default group (on this one alone without one)."""
    if (
        not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or torch.distributed.get_world_size() == 1
    ):
        return holds
    flag = torch.tensor(int(holds), device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return bool(flag)


def all_finite(tensors) -> bool:
    """Whether every tensor holds only finite values, with one sync per device."""
    by_device = {}
    for tensor in tensors:
        if tensor.is_floating_point() and tensor.numel():
            by_device.setdefault(tensor.device, []).append(tensor.detach())
    for group in by_device.values():
        largest = torch._foreach_norm(group, ord=float("inf"))
        if not bool(torch.stack([value.float() for value in largest]).isfinite().all()):
            return False
    return True


class TrainingSplitFingerprint(TrainerCallback, ExportableState):
    """Keeps, in every checkpoint's `trainer_state.json`, the fingerprint of the training split that the model's
    label plan was built from (`LabelLayout.split_fingerprint`): `HasteTrainer` refuses to resume a checkpoint of
    another split, which a model of the same shape would otherwise continue in silence."""

    def __init__(self, fingerprint: str):
        self.fingerprint = fingerprint

    def state(self) -> dict:
        return {"args": {"fingerprint": self.fingerprint}, "attributes": {}}
