# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Optimizers and schedules of HASTE training: AdamW on the encoder, SGD on the output layer.

- `StochasticRoundingSGD`: SGD with momentum and decoupled weight decay whose update is computed in
  float32 and, for bfloat16 parameters, rounded back stochastically, so the many updates smaller than
  half a bf16 ulp are not all lost to round-to-nearest.
- `HasteOptimizer`: one `torch.optim.Optimizer` over two child optimizers; its ``param_groups`` are the
  children's own group dicts, so accelerate (mixed precision, gradient clipping, skipped steps) and
  the Trainer see every parameter and learning rate.
- `HasteScheduler` / `get_haste_scheduler`: one transformers schedule per child, stepped as one.
"""

import hashlib
import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from transformers import get_scheduler

from ..kernels import triton_sgd
from ..modeling.sparse_ops import chunks


if TYPE_CHECKING:
    from ..modeling.modeling_haste import HasteForExtremeClassification


# Bounds the float32 copies of parameter, gradient and momentum made by one update, so an output layer
# of 10^8+ bf16 weights is updated with ~100 MB of scratch memory instead of several GB.
_CHUNK_ELEMENTS = 1 << 24


def split_parameters(
    model: "HasteForExtremeClassification",
) -> tuple[list[tuple[str, torch.nn.Parameter]], list[torch.nn.Parameter]]:
    """(encoder-side named parameters, output-layer parameters) of a HASTE model: the output layer's
    `output_parameters()` (the dense head and the sparse tail) train with SGD; everything else trainable,
    the projections included, with the encoder."""
    output_layer = model.output_layer.output_parameters()
    in_output_layer = {id(param) for param in output_layer}
    encoder_side = [
        (name, param)
        for name, param in model.named_parameters()
        if param.requires_grad and id(param) not in in_output_layer
    ]
    return encoder_side, output_layer


def output_parameter_groups(
    model: "HasteForExtremeClassification", learning_rate: float, tail_learning_rate_scale: float = 1.0
) -> list[dict]:
    """The output layer's SGD parameter groups: one group of `split_parameters`' output-layer parameters at
    `learning_rate`; with `tail_learning_rate_scale` other than 1, the head's and the tail's apart, the tail's at
    `learning_rate * tail_learning_rate_scale` (one schedule scales both). Parameters keep their order, so the
    optimizer numbers them (and seeds their rounding bits) alike either way."""
    output_layer = split_parameters(model)[1]
    if tail_learning_rate_scale == 1.0:  # one group, as before the option: earlier checkpoints resume
        return [{"params": output_layer, "lr": learning_rate}]
    tail = model.output_layer.tail
    in_tail = {id(param) for param in tail.parameters()} if tail is not None else set()
    groups = [
        {"params": [param for param in output_layer if id(param) not in in_tail], "lr": learning_rate},
        {
            "params": [param for param in output_layer if id(param) in in_tail],
            "lr": learning_rate * tail_learning_rate_scale,
        },
    ]
    return [group for group in groups if group["params"]]


def _row_chunks(tensor: torch.Tensor) -> Iterator[slice]:
    if tensor.dim() == 0:
        yield slice(None)
        return
    # Not tensor[0]: a rank's share of the output layer may have no rows.
    yield from chunks(tensor.shape[0], math.prod(tensor.shape[1:]), _CHUNK_ELEMENTS)


def stochastic_round_to_bfloat16(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Round float32 ``values`` to bfloat16, up or down with probabilities that make the result unbiased.

    A bf16 number is the upper 16 bits of a float32. Adding a uniform random integer in ``[0, 2^16)``
    to the float32 bit pattern and dropping the low 16 bits rounds the magnitude up with probability
    (dropped bits) / 2^16, hence ``E[round(x)] = x``. Infinities are kept; NaNs are passed through
    explicitly because the bit trick could wrap a NaN with a large payload into -0.
    """
    if values.dtype != torch.float32:
        raise ValueError(f"`values` must be float32, got {values.dtype}.")
    noise = torch.randint(0, 1 << 16, values.shape, dtype=torch.int32, device=values.device, generator=generator)
    bits = (values.contiguous().view(torch.int32) + noise).bitwise_and_(-(1 << 16))
    rounded = bits.view(torch.float32).to(torch.bfloat16)
    return torch.where(torch.isnan(values), values.to(torch.bfloat16), rounded)


def _stable_seed(*parts) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _closure_loss(closure):
    """The loss `closure` recomputes, with gradients on as torch's optimizers do; None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class StochasticRoundingSGD(torch.optim.Optimizer):
    """SGD with momentum, decoupled weight decay and stochastic rounding of bfloat16 parameters.

    Per step, for each parameter ``p`` with gradient ``g`` (in float32):

        buf = momentum * buf + g                  (buf = g on the first step; skipped when momentum == 0)
        d   = g + momentum * buf if nesterov else buf
        p   = p * (1 - lr * weight_decay) - lr * d

    With ``weight_decay == 0`` this is exactly `torch.optim.SGD` (dampening 0); torch's ``weight_decay``
    is an L2 term added to the gradient instead (coupled), so the two differ when it is non-zero.

    Rounding: float32 parameters are updated in place, exactly. Bfloat16 parameters (and bf16 momentum
    buffers) are stored by stochastic rounding when ``stochastic_rounding`` is True, by round-to-nearest
    otherwise; other dtypes round to nearest. The random bits of parameter ``i`` at its ``n``-th update
    are a function of ``(seed, i, n)`` alone: fresh every step and every parameter, identical on every
    data-parallel rank (so replicas stay equal), and the only state they need, the per-parameter step
    count ``state[p]["step"]``, is in `state_dict`, so a resumed run continues bit for bit.

    Contiguous bf16 CUDA parameters are updated by one fused Triton kernel (`haste_hf.kernels.triton_sgd`;
    ``fused=None``: when Triton is installed; ``True``: required; ``False``: never) that reads and writes
    each weight and buffer once and draws its bits from Philox; elsewhere a PyTorch update in float32 blocks
    (`stochastic_round_to_bfloat16` with a generator seeded per parameter and step). Both compute the
    same update; their random bits differ, so CPU, fused and unfused runs agree in distribution, not bit
    for bit.

    `update_rows_` applies the update slice by slice where a caller computes the gradient (the fused update
    of `haste_hf.modeling.losses.chunk_loss_backward_`), so that no parameter-sized gradient exists.

    Momentum buffers are float32 by default (``momentum_dtype``): 4 bytes per weight on top of 2 for
    bf16 weights, but a bf16 buffer rounded to nearest would drop every gradient below 1/256 of the
    running average. ``momentum_dtype=None`` keeps the buffer in the parameter's dtype (stochastically
    rounded as well) to halve that memory. No buffer is allocated while ``momentum == 0``.
    """

    def __init__(
        self,
        params,
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        stochastic_rounding: bool = True,
        momentum_dtype: torch.dtype | None = torch.float32,
        seed: int = 0,
        fused: bool | None = None,
    ):
        if lr < 0.0:
            raise ValueError(f"`lr` must be >= 0, got {lr}.")
        if momentum < 0.0:
            raise ValueError(f"`momentum` must be >= 0, got {momentum}.")
        if weight_decay < 0.0:
            raise ValueError(f"`weight_decay` must be >= 0, got {weight_decay}.")
        if nesterov and momentum == 0.0:
            raise ValueError("`nesterov=True` needs `momentum > 0`.")
        if momentum_dtype is not None and not momentum_dtype.is_floating_point:
            raise ValueError(f"`momentum_dtype` must be a floating dtype or None, got {momentum_dtype}.")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
            "stochastic_rounding": stochastic_rounding,
        }
        super().__init__(params, defaults)
        self.momentum_dtype = momentum_dtype
        self.seed = seed
        self.fused = fused
        self._generators: dict[torch.device, torch.Generator] = {}
        self._updated_in_backward = set()

    def _buffer_dtype(self, param: torch.Tensor) -> torch.dtype:
        return param.dtype if self.momentum_dtype is None else self.momentum_dtype

    def _generator(self, device: torch.device, seed: int) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device)
        return self._generators[device].manual_seed(seed)

    @staticmethod
    def _store_(target: torch.Tensor, values: torch.Tensor, stochastic: bool, generator) -> None:
        if values is target:
            return
        if stochastic and target.dtype == torch.bfloat16:
            target.copy_(stochastic_round_to_bfloat16(values, generator))
        else:
            target.copy_(values)

    def _use_fused(self, param: torch.Tensor, grad: torch.Tensor, buffer: torch.Tensor | None, group: dict) -> bool:
        eligible = (
            param.is_cuda
            and param.dtype == torch.bfloat16
            and group["stochastic_rounding"]
            and param.is_contiguous()
            and grad.is_contiguous()
            and (buffer is None or (buffer.is_contiguous() and buffer.dtype in (torch.float32, torch.bfloat16)))
        )
        if self.fused and not (eligible and triton_sgd.is_available()):
            raise RuntimeError(
                "`fused=True` needs Triton and contiguous bfloat16 CUDA parameters with stochastic rounding; "
                "pass `fused=None` to fall back to the PyTorch update elsewhere."
            )
        return self.fused is not False and eligible and triton_sgd.is_available()

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        param_index = -1
        for group in self.param_groups:
            for param in group["params"]:
                param_index += 1
                if param in self._updated_in_backward:
                    # `update_rows_` already applied this step's update, slice by slice in the backward.
                    self.state[param]["step"] = self.state[param].get("step", 0) + 1
                    continue
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("StochasticRoundingSGD does not support sparse gradients.")
                state = self.state[param]
                state["step"] = state.get("step", 0) + 1
                first_momentum_step = group["momentum"] != 0.0 and "momentum_buffer" not in state
                if first_momentum_step:
                    state["momentum_buffer"] = torch.empty_like(param, dtype=self._buffer_dtype(param))
                buffer = state["momentum_buffer"] if group["momentum"] != 0.0 else None
                seed = _stable_seed("haste_hf.sgd", self.seed, param_index, state["step"])
                self._apply_(param, param.grad, buffer, group, first_momentum_step, seed)
        self._updated_in_backward.clear()
        return loss

    def update_rows_(self, param: torch.Tensor, rows: slice, grad: torch.Tensor) -> None:
        """Applies this step's update to ``param[rows]`` from its gradient ``grad`` (shape of ``param[rows]``)
        at once, so that a caller computing the gradient slice by slice
        (`haste_hf.modeling.losses.chunk_loss_backward_`) never holds all of it; ``step()`` then only counts the step
        for ``param``. The same update as ``step()``'s, random bits aside (drawn per slice). Rows are the
        first dimension; each row is updated once a step."""
        group, index = self._place_of(param)
        state = self.state[param]
        if group["momentum"] != 0.0 and "momentum_buffer" not in state:
            # Zeros: `momentum * 0 + grad` is the first step's `buf = grad` exactly, whatever slice comes first.
            state["momentum_buffer"] = torch.zeros_like(param, dtype=self._buffer_dtype(param))
        buffer = state["momentum_buffer"][rows] if group["momentum"] != 0.0 else None
        seed = _stable_seed("haste_hf.sgd", self.seed, index, state.get("step", 0) + 1, rows.start)
        self._apply_(param[rows], grad, buffer, group, False, seed)
        self._updated_in_backward.add(param)

    def _place_of(self, param: torch.Tensor) -> tuple[dict, int]:
        """(group, index among all parameters) of ``param``, the index that seeds its random bits."""
        index = 0
        for group in self.param_groups:
            for candidate in group["params"]:
                if candidate is param:
                    return group, index
                index += 1
        raise ValueError("`param` is not a parameter of this optimizer.")

    def _apply_(self, param, grad, buffer, group, first_momentum_step: bool, seed: int) -> None:
        if self._use_fused(param, grad, buffer, group):
            triton_sgd.fused_bfloat16_sgd_(param, grad, buffer, group, first_momentum_step, seed)
        else:
            self._update_(param, grad, buffer, group, first_momentum_step, seed)

    def _update_(self, param, grad_param, buffer, group, first_momentum_step: bool, seed: int) -> None:
        """The PyTorch update, in float32 blocks of rows; exact `torch.optim.SGD` arithmetic for float32."""
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        stored_dtypes = {param.dtype, param.dtype if buffer is None else buffer.dtype}
        stochastic = group["stochastic_rounding"] and torch.bfloat16 in stored_dtypes
        generator = self._generator(param.device, seed) if stochastic else None
        for rows in _row_chunks(param):
            grad = grad_param[rows].float()
            direction = grad
            if buffer is not None:
                average = grad if first_momentum_step else buffer[rows].float().mul_(momentum).add_(grad)
                self._store_(buffer[rows], average, stochastic, generator)
                direction = grad.add(average, alpha=momentum) if group["nesterov"] else average
            weights = param[rows].float()
            if weight_decay != 0.0:
                weights.mul_(1.0 - lr * weight_decay)
            weights.add_(direction, alpha=-lr)
            self._store_(param[rows], weights, stochastic, generator)

    def load_state_dict(self, state_dict):
        # torch casts floating state to the parameter dtype on load, which would turn float32 momentum
        # of bf16 parameters into bf16: put the saved buffers back in the dtype this optimizer keeps.
        saved_ids = [index for group in state_dict["param_groups"] for index in group["params"]]
        buffers = {
            index: state["momentum_buffer"]
            for index, state in state_dict["state"].items()
            if "momentum_buffer" in state
        }
        super().load_state_dict(state_dict)
        params = [param for group in self.param_groups for param in group["params"]]
        for index, param in zip(saved_ids, params):
            if index in buffers:
                self.state[param]["momentum_buffer"] = buffers[index].to(
                    device=param.device, dtype=self._buffer_dtype(param), copy=True
                )


class _MergedState(Mapping):
    """Live read-only view of the ``state`` of several optimizers with disjoint parameters."""

    def __init__(self, optimizers):
        self._optimizers = optimizers

    def __getitem__(self, param):
        for optimizer in self._optimizers:
            if param in optimizer.state:  # `in`, not `[]`: the children's defaultdicts would insert
                return optimizer.state[param]
        raise KeyError(param)

    def __iter__(self):
        for optimizer in self._optimizers:
            yield from optimizer.state

    def __len__(self):
        return sum(len(optimizer.state) for optimizer in self._optimizers)


class HasteOptimizer(torch.optim.Optimizer):
    """Steps an encoder optimizer (AdamW) and an output-layer optimizer (`StochasticRoundingSGD`) as one.

    ``param_groups`` lists the children's own group dicts (encoder first), so changes made through it
    (learning rates, gradient clipping, accelerate's device moves) reach the children, and the
    children's schedulers show through it. ``state`` is a live view of both children's states. Like
    accelerate's ``AcceleratedOptimizer``, it wraps rather than initialises a `torch.optim.Optimizer`;
    add parameter groups to a child.
    """

    def __init__(self, encoder_optimizer: torch.optim.Optimizer, output_optimizer: torch.optim.Optimizer):
        encoder_params = {id(p) for group in encoder_optimizer.param_groups for p in group["params"]}
        if any(id(p) in encoder_params for group in output_optimizer.param_groups for p in group["params"]):
            raise ValueError("`encoder_optimizer` and `output_optimizer` share parameters; give each parameter to one.")
        self.encoder_optimizer = encoder_optimizer
        self.output_optimizer = output_optimizer
        self.defaults = {}

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
        return self.encoder_optimizer, self.output_optimizer

    @property
    def param_groups(self) -> list[dict]:
        # Read from the children every time: their load_state_dict replaces the group dicts.
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self) -> Mapping:
        return _MergedState(self.optimizers)

    def add_param_group(self, param_group):
        raise NotImplementedError("Add parameter groups to `encoder_optimizer` or `output_optimizer` instead.")

    @torch.no_grad()
    def step(self, closure=None):
        loss = _closure_loss(closure)
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True):
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"encoder": self.encoder_optimizer.state_dict(), "output": self.output_optimizer.state_dict()}

    def load_state_dict(self, state_dict):
        if set(state_dict) != {"encoder", "output"}:
            raise ValueError(
                f"Expected a HasteOptimizer state dict with keys 'encoder' and 'output', got {sorted(state_dict)}."
            )
        saved, ours = len(state_dict["output"]["param_groups"]), len(self.output_optimizer.param_groups)
        if saved != ours:
            # One group: head and tail at one rate (`output_tail_lr_scale` 1, every checkpoint before that default
            # changed); two: the tail's apart. With as many groups, the saved rates win (torch restores each group's
            # rates, the scheduler its base rates), so only the group count can mismatch.
            raise ValueError(
                f"The checkpoint's output-layer optimizer has {saved} parameter group(s) and this run's {ours}: it was "
                f"trained with {'' if saved == 1 else 'no '}`output_tail_lr_scale` 1 (one rate for head and tail). "
                "Resume it as it was trained: "
                + (
                    "--output-tail-lr-scale 1 (`output_tail_lr_scale=1` in HasteTrainingArguments)."
                    if saved == 1
                    else "--output-tail-lr-scale (`output_tail_lr_scale`) other than 1."
                )
            )
        self.encoder_optimizer.load_state_dict(state_dict["encoder"])
        self.output_optimizer.load_state_dict(state_dict["output"])

    def __repr__(self):
        return f"{type(self).__name__}(\nencoder={self.encoder_optimizer!r},\noutput={self.output_optimizer!r}\n)"


def unwrap_haste_optimizer(optimizer) -> HasteOptimizer:
    """The `HasteOptimizer` inside wrappers such as accelerate's ``AcceleratedOptimizer``."""
    current = optimizer
    while not isinstance(current, HasteOptimizer):
        if not hasattr(current, "optimizer"):
            raise TypeError(f"Expected a HasteOptimizer (possibly wrapped), got {type(optimizer).__name__}.")
        current = current.optimizer
    return current


class HasteScheduler:
    """One learning-rate scheduler per child of a `HasteOptimizer`, stepped, saved and loaded as one.

    `get_last_lr` lists the encoder's rates first, so ``get_last_lr()[0]`` (what the Trainer logs) is the
    encoder learning rate.
    """

    def __init__(self, encoder_scheduler, output_scheduler):
        self.encoder_scheduler = encoder_scheduler
        self.output_scheduler = output_scheduler

    @property
    def schedulers(self):
        return self.encoder_scheduler, self.output_scheduler

    def step(self):
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return [lr for scheduler in self.schedulers for lr in scheduler.get_last_lr()]

    def state_dict(self):
        return {"encoder": self.encoder_scheduler.state_dict(), "output": self.output_scheduler.state_dict()}

    def load_state_dict(self, state_dict):
        self.encoder_scheduler.load_state_dict(state_dict["encoder"])
        self.output_scheduler.load_state_dict(state_dict["output"])


def warmup_steps_for(warmup: float, num_training_steps: int) -> int:
    """Warm-up length as in `transformers.TrainingArguments.warmup_steps`: ``>= 1`` is a step count,
    ``< 1`` a fraction of ``num_training_steps`` (rounded up)."""
    if warmup < 0:
        raise ValueError(f"Warm-up must be >= 0 (steps, or a fraction < 1 of training), got {warmup}.")
    return int(warmup) if warmup >= 1 else math.ceil(round(warmup * num_training_steps, 6))


def get_haste_scheduler(
    optimizer,
    num_training_steps: int,
    encoder_scheduler_type: str = "linear",
    encoder_warmup: float = 0.0,
    output_scheduler_type: str = "cosine",
    output_warmup: float = 0.0,
    encoder_scheduler_kwargs: dict | None = None,
    output_scheduler_kwargs: dict | None = None,
) -> HasteScheduler:
    """Warm-up-then-decay schedules for both children of ``optimizer`` (a `HasteOptimizer`, also wrapped).

    Scheduler types are those of `transformers.get_scheduler` ("linear", "cosine", "constant_with_warmup",
    "cosine_with_min_lr", ...; extra arguments through ``*_scheduler_kwargs``). Warm-ups follow
    `warmup_steps_for`.
    """
    haste_optimizer = unwrap_haste_optimizer(optimizer)
    schedulers = [
        get_scheduler(
            scheduler_type,
            child,
            num_warmup_steps=warmup_steps_for(warmup, num_training_steps),
            num_training_steps=num_training_steps,
            scheduler_specific_kwargs=kwargs,
        )
        for child, scheduler_type, warmup, kwargs in (
            (haste_optimizer.encoder_optimizer, encoder_scheduler_type, encoder_warmup, encoder_scheduler_kwargs),
            (haste_optimizer.output_optimizer, output_scheduler_type, output_warmup, output_scheduler_kwargs),
        )
    ]
    return HasteScheduler(*schedulers)
