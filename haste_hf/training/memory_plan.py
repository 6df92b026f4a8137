# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The memory options `HasteTrainer` chooses where the user left them unset (None), in one place.

- Output layer (`output_momentum_dtype`, `output_chunked_backward`, `output_fused_update`): on where the output
  layer trains in bf16 on a GPU, the setting they were measured in (issue 28, `benchmarks/step.py`, H100, 8.6M
  labels: 13.0 GiB against 18.7 at +1% step time; `deps` through the CLI 72.92 / 50.60 / 39.03 P@1/3/5 against
  72.99 / 50.62 / 39.09). Elsewhere (CPUs, an fp32 output layer) off: there the output layer is small or runs the
  pure-PyTorch path, whose chunked backward recomputes logits without a fused kernel, and bf16 momentum of fp32
  weights was never measured. The fused update is turned off, with one info line, where the run needs the whole
  output-layer gradient before the step (gradient accumulation, output clipping, fp16, `on_non_finite='skip'`, a
  replicated output layer on several processes).
- Encoder checkpointing (`gradient_checkpointing`): only where the planned peak (`planned_peak_bytes`) would not
  fit `DEVICE_MEMORY_SHARE` of the GPU, and then for as few blocks as fit (every N-th block) where the installed
  transformers can checkpoint some blocks only. Never on a CPU: no device memory to plan against.

What the plan chose, and why, is logged in one info line (`--log-level info` shows it), and a warning where even
every block checkpointed does not fit.
"""

import inspect
import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..modeling.logging_utils import get_logger
from ..modeling.losses import DEFAULT_LOSS_CHUNK_ELEMENTS
from .optimization import split_parameters
from .training_args import fused_update_conflicts


logger = get_logger(__name__)

# Bytes of one encoder block's stored activations per token under bf16 autocast: ACTIVATION_BYTES_PER_HIDDEN * hidden
# + ATTENTION_BYTES_PER_HEAD_TOKEN * heads * tokens (the form of Korthikanti et al.'s 34 h + 5 a s), fitted to
# MPNet-base on an H100 at batch 128 x 128 tokens: 0.6 GiB a block (issue 28: 13.0 GiB with no block checkpointed,
# 9.3 with every 2nd, 5.8 with all). Twice as much without bf16 autocast.
ACTIVATION_BYTES_PER_HIDDEN = 46
ATTENTION_BYTES_PER_HEAD_TOKEN = 5
# fp32 weight, gradient and AdamW's two moments of each trained encoder-side parameter.
TRAINED_PARAMETER_BYTES = 16
# Bytes per element of the `[batch, labels]` logits left whole (no chunked backward): the stored logit gradient
# and the loss's transients, fitted to the same runs (18.7 GiB with every option off).
WHOLE_LOGIT_BYTES = 4
# The planned peak must fit this share of the GPU: the CUDA context, library workspaces and the allocator's
# fragmentation are not in the plan.
DEVICE_MEMORY_SHARE = 0.85
# Candidate checkpointing, cheapest first: 0 none, N every N-th block (1: every block).
CHECKPOINT_CHOICES = (0, 4, 3, 2, 1)


@dataclass(frozen=True)
class MemoryPlan:
    """The resolved options. `checkpoint_every`: None where the user set encoder checkpointing (the Trainer applies
    it), else 0 (none) or N (every N-th block). The planned peak and the device's memory in bytes (None on CPUs).
    `momentum_buffer`: whether the output layer keeps momentum (`output_momentum` > 0); without it the momentum
    dtype is moot, counts no bytes and the plan's line says "no momentum"."""

    output_momentum_dtype: str
    output_chunked_backward: bool
    output_fused_update: bool
    checkpoint_every: int | None
    planned_peak: int | None = None
    device_memory: int | None = None
    momentum_buffer: bool = True


def device_memory_of(device: torch.device) -> int | None:
    """Bytes of memory of the GPU `device`; None for a CPU."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


# transformers 5.24 renamed `gradient_checkpointing_enable` `activation_checkpointing_enable` (the old name warns
# that it goes in v6); earlier releases have the old name alone.
CHECKPOINTING_ENABLE = (
    "activation_checkpointing_enable"
    if hasattr(PreTrainedModel, "activation_checkpointing_enable")
    else "gradient_checkpointing_enable"
)


def partial_checkpointing_supported() -> bool:
    """Whether this transformers' checkpointing call can checkpoint every N-th block only."""
    parameters = inspect.signature(getattr(PreTrainedModel, CHECKPOINTING_ENABLE)).parameters
    return "every_n_layers" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def enable_encoder_checkpointing(model, every: int) -> None:
    """Checkpoints every `every`-th encoder block of `model` (1: every block), through this transformers' current
    call."""
    if every != 1 and not partial_checkpointing_supported():
        raise ValueError(
            f"Checkpointing every {every}-th encoder block needs a transformers whose `{CHECKPOINTING_ENABLE}` takes "
            "`every_n_layers`; this one checkpoints every block: ask for 1, or upgrade transformers."
        )
    getattr(model, CHECKPOINTING_ENABLE)(**({} if every == 1 else {"every_n_layers": every}))


def output_buffer_bytes(layer, sharded: bool) -> int:
    """Bytes of the output layer's buffers, by their dtypes: the tail's supports (int32 `[K, F]`), the label ids of its
    positions (int64); and for one rank's share (`sharded`), the sorted lookup of its ids, an id and a position of
    each in int32 (int64 past 2**31 labels: `ShardedOutputLayer._share_lookup`)."""
    total = sum(buffer.numel() * buffer.element_size() for buffer in layer.buffers())
    if sharded:
        total += layer.output_labels.numel() * 2 * (4 if layer.label_count < 2**31 else 8)
    return total


def planned_peak_bytes(
    model,
    *,
    sharded: bool = False,
    batch_size: int,
    tokens: int,
    loss_rows: int,
    momentum_dtype: str,
    momentum: bool,
    chunked_backward: bool,
    fused_update: bool,
    checkpoint_every: int,
    autocast_bf16: bool,
) -> int:
    """The planned peak memory of one training step of `model` (a `HasteForExtremeClassification`, its output layer
    cast and sharded as it trains) on one device: encoder-side weights, gradients and AdamW state; the output
    layer's weights, gradients (none with the fused update) and momentum, and its buffers (`output_buffer_bytes`;
    `sharded`: one rank's share); the logits' share (a chunk with the chunked backward); and the encoder's stored
    activations, of `checkpoint_every` (0: none)."""

    encoder_side, output_layer = split_parameters(model)
    trained = {id(param) for _, param in encoder_side}
    in_output_layer = {id(param) for param in output_layer}
    total = sum(
        param.numel() * (TRAINED_PARAMETER_BYTES if id(param) in trained else param.element_size())
        for param in model.parameters()
        if id(param) not in in_output_layer
    )
    weights = sum(param.numel() * param.element_size() for param in output_layer)
    total += weights * (1 if fused_update else 2)
    if momentum:
        total += (
            sum(param.numel() for param in output_layer)
            * torch.empty((), dtype=getattr(torch, momentum_dtype)).element_size()
        )
    layer = model.output_layer
    total += output_buffer_bytes(layer, sharded)
    # Rows of this rank's weights: a dense `[n, d]` head, a group-sparse `[K, G, F]` tail.
    positions = sum(math.prod(module.weight.shape[:-1]) for module in (layer.head, layer.tail) if module is not None)
    if chunked_backward or fused_update:
        total += min(loss_rows * positions, DEFAULT_LOSS_CHUNK_ELEMENTS) * 4
    else:
        total += loss_rows * positions * WHOLE_LOGIT_BYTES
    encoder = model.config.encoder
    layers = getattr(encoder, "num_hidden_layers", 0)
    hidden = getattr(encoder, "hidden_size", 0)
    heads = getattr(encoder, "num_attention_heads", 0)
    scale = 1 if autocast_bf16 else 2
    block = (
        batch_size * tokens * (ACTIVATION_BYTES_PER_HIDDEN * hidden + ATTENTION_BYTES_PER_HEAD_TOKEN * heads * tokens)
    )
    checkpointed = math.ceil(layers / checkpoint_every) if checkpoint_every else 0
    stored_inputs = checkpointed * batch_size * tokens * hidden * 2
    recomputed = block if checkpointed else 0  # one block's activations, rebuilt in its backward
    total += scale * ((layers - checkpointed) * block + stored_inputs + recomputed)
    return total


def plan_memory(args, model, *, tokens: int, sharded: bool, device_memory: int | None) -> MemoryPlan:
    """Resolves the memory options `args` (a `HasteTrainingArguments`) left unset for `model` (as above) trained
    on `tokens`-token inputs; `device_memory`: the GPU's bytes, None on CPUs. Logs one info line for each option
    the plan turns off that it would otherwise turn on, and one info line of what it chose and why."""
    on_gpu = device_memory is not None
    lean = on_gpu and args.output_layer_dtype == "bfloat16"
    momentum_dtype = args.output_momentum_dtype or ("bfloat16" if lean else "float32")
    # A chunk size given asks for the chunked backward it sizes (unasked on a CPU, it would be ignored).
    chunked = (
        lean or bool(args.output_loss_chunk_labels)
        if args.output_chunked_backward is None
        else args.output_chunked_backward
    )
    fused = args.output_fused_update
    if fused is None:
        fused = lean
        conflicts = [f"{name}={getattr(args, name)!r}" for name, _ in fused_update_conflicts(args)]
        if args.world_size > 1 and not sharded:
            conflicts.append("a replicated output layer on several processes (shard_output_layer=False)")
        if fused and conflicts:
            fused = False
            logger.info(
                f"output_fused_update is off: {', '.join(conflicts)} needs the whole output-layer gradient before the "
                "step (pass output_fused_update=False to say so)."
            )
    momentum = args.output_momentum > 0
    if args._checkpointing_given:
        plan = MemoryPlan(momentum_dtype, chunked, fused, None, device_memory=device_memory, momentum_buffer=momentum)
        logger.info(describe(plan, lean))
        return plan
    loss_rows = args.per_device_train_batch_size * (args.world_size if sharded else 1)
    choices = CHECKPOINT_CHOICES if partial_checkpointing_supported() else (0, 1)
    peak = None
    for every in choices if on_gpu else (0,):
        peak = planned_peak_bytes(
            model,
            sharded=sharded,
            batch_size=args.per_device_train_batch_size,
            tokens=tokens,
            loss_rows=loss_rows,
            momentum_dtype=momentum_dtype,
            momentum=momentum,
            chunked_backward=chunked,
            fused_update=fused,
            checkpoint_every=every,
            autocast_bf16=bool(args.bf16),
        )
        if not on_gpu or peak <= DEVICE_MEMORY_SHARE * device_memory:
            break
    else:
        logger.warning(
            f"The planned peak memory, {peak / 2**30:.1f} GiB with every encoder block checkpointed, exceeds "
            f"{DEVICE_MEMORY_SHARE:.0%} of the GPU's {device_memory / 2**30:.1f} GiB: lower the batch size or "
            "max_length, or shard the output layer over more GPUs."
        )
    plan = MemoryPlan(
        momentum_dtype,
        chunked,
        fused,
        every,
        planned_peak=peak if on_gpu else None,
        device_memory=device_memory,
        momentum_buffer=momentum,
    )
    logger.info(describe(plan, lean))
    return plan


def describe(plan: MemoryPlan, lean: bool) -> str:
    """One line: what `plan` chose and why (`lean`: the output layer trains in bf16 on a GPU)."""
    momentum = f"momentum {plan.output_momentum_dtype}" if plan.momentum_buffer else "no momentum"
    output = (
        f"{momentum}, chunked backward {'on' if plan.output_chunked_backward else 'off'}, "
        f"fused update {'on' if plan.output_fused_update else 'off'}"
    )
    if plan.device_memory is None:
        return (
            f"Memory plan: output layer {output}; no encoder checkpointing (a CPU: no device memory to plan against)."
        )
    why = "a bf16 output layer on a GPU" if lean else "an fp32 output layer"
    if plan.checkpoint_every is None:
        checkpointing = "encoder checkpointing as given"
    else:
        share = f"{DEVICE_MEMORY_SHARE:.0%} of the GPU's {plan.device_memory / 2**30:.1f} GiB"
        peak = f"planned peak {plan.planned_peak / 2**30:.1f} GiB"
        if plan.checkpoint_every == 0:
            checkpointing = f"no encoder checkpointing ({peak}, within {share})"
        else:
            blocks = "every block" if plan.checkpoint_every == 1 else f"every {plan.checkpoint_every}-th block"
            checkpointing = f"encoder checkpointing of {blocks} ({peak}; with fewer blocks it exceeds {share})"
    return f"Memory plan: output layer {output} ({why}, options not given); {checkpointing}."
