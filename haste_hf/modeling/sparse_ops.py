# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The group-shared fixed fan-in linear map, the only op of HASTE's sparse tail.

Output slot ``s = k * G + g`` reads the ``F`` features ``supports[k]`` of ``x`` and owns the weights
``weight[k, g]``:

    out[b, k * G + g] = sum_f weight[k, g, f] * x[b, supports[k, f]]  (+ bias[k * G + g])

`group_sparse_linear` is the single entry point, and `GroupSparseLinear` the tail module around it. On CUDA tensors it hands the work to the compiled
kernels of `haste_hf.kernels.ops` when they are installed and built; everywhere else (and in a checkpoint
folder exported to the Hub, where `haste_hf` may be absent) the PyTorch path below computes the same
thing.
"""

import importlib
import math

import torch
from torch import nn

from .initialization import random_supports


# Bounds the transient gathered block `[B, groups, F]` of the PyTorch path to this many elements, so
# its memory does not grow with the label count.
_GATHER_CHUNK_ELEMENTS = 1 << 24


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, bias: torch.Tensor | None):
    if x.dim() != 2:
        raise ValueError(f"`x` must be 2-D [batch, features], got shape {tuple(x.shape)}; flatten leading dims first.")
    if weight.dim() != 3:
        raise ValueError(f"`weight` must be 3-D [groups, group_size, fan_in], got shape {tuple(weight.shape)}.")
    num_groups, _, fan_in = weight.shape
    if supports.shape != (num_groups, fan_in):
        raise ValueError(
            f"`supports` must have shape [groups, fan_in] = {(num_groups, fan_in)} to match `weight`, "
            f"got {tuple(supports.shape)}."
        )
    if supports.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"`supports` must be an integer tensor (int32), got {supports.dtype}.")
    if x.dtype != weight.dtype:
        raise ValueError(f"`x` ({x.dtype}) and `weight` ({weight.dtype}) must share a dtype; cast one of them.")
    if len({x.device, weight.device, supports.device}) != 1:
        raise ValueError(
            f"`x` ({x.device}), `weight` ({weight.device}) and `supports` ({supports.device}) must be on one device."
        )
    if bias is not None and (bias.shape != (num_groups * weight.shape[1],) or bias.dtype != x.dtype):
        raise ValueError(
            f"`bias` must be a {x.dtype} vector of length groups * group_size = {num_groups * weight.shape[1]}, "
            f"got {bias.dtype} of shape {tuple(bias.shape)}."
        )


def chunks(count: int, unit_size: int, budget: int):
    """Consecutive slices covering `range(count)`, each of at most `budget // unit_size` units (at least
    one): how the package bounds every transient block (logits, gathered features, scores) whatever L."""
    step = max(1, budget // max(1, unit_size))
    for start in range(0, count, step):
        yield slice(start, min(start + step, count))


def _group_chunks(batch_size: int, num_groups: int, fan_in: int):
    return chunks(num_groups, batch_size * fan_in, _GATHER_CHUNK_ELEMENTS)


def _forward_reference(x, weight, supports):
    batch_size = x.shape[0]
    num_groups, group_size, fan_in = weight.shape
    out = x.new_empty(batch_size, num_groups, group_size)
    for chunk in _group_chunks(batch_size, num_groups, fan_in):
        gathered = x[:, supports[chunk]]  # [B, k, F]
        out[:, chunk] = torch.einsum("bkf,kgf->bkg", gathered, weight[chunk])
    return out.view(batch_size, num_groups * group_size)


class _GroupSparseLinearFunction(torch.autograd.Function):
    """Autograd of the PyTorch path. Keeps only `x`, `weight` and `supports` for backward: the gathered
    features are recomputed chunk by chunk, as cheap as reading them back and far smaller at large L."""

    @staticmethod
    def forward(ctx, x, weight, supports):
        ctx.save_for_backward(x, weight, supports)
        return _forward_reference(x, weight, supports)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, supports = ctx.saved_tensors
        batch_size = x.shape[0]
        num_groups, group_size, fan_in = weight.shape
        grad_out = grad_out.reshape(batch_size, num_groups, group_size)
        # Every feature collects one term per group that reads it (K * F / d of them, thousands at large L):
        # summed in bf16 / fp16 they lose most of their digits, so the sum is kept in fp32 (at least).
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.zeros(x.shape, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for chunk in _group_chunks(batch_size, num_groups, fan_in):
            chunk_grad = grad_out[:, chunk]
            chunk_supports = supports[chunk]
            if grad_weight is not None:
                grad_weight[chunk] = torch.einsum("bkg,bkf->kgf", chunk_grad, x[:, chunk_supports])
            if grad_x is not None:
                grad_gathered = torch.einsum("bkg,kgf->bkf", chunk_grad, weight[chunk])
                grad_x.index_add_(1, chunk_supports.reshape(-1), grad_gathered.reshape(batch_size, -1).to(grad_x.dtype))
        return None if grad_x is None else grad_x.to(x.dtype), grad_weight, None


def _compiled_kernels():
    """`haste_hf.kernels.ops` when it is installed and usable, else None.

    Imported by absolute name on purpose: a checkpoint folder exported with its modeling code carries
    this file but not the CUDA sources, and must fall back to the PyTorch path there.
    """
    try:
        return importlib.import_module("haste_hf.kernels.ops")
    except ImportError:
        return None


# Looked up once at import, so that `torch.compile` sees a plain module attribute, not an import.
_KERNELS = _compiled_kernels()


def group_sparse_linear(
    x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Group-shared fixed fan-in linear map `[B, d] -> [B, K * G]` (see the module docstring).

    Args:
        x: features `[B, d]`.
        weight: per-label weights `[K, G, F]` on their group's support, same dtype as `x`.
        supports: int32 `[K, F]`, the feature indices of each group (distinct within a group, in `[0, d)`).
        bias: optional `[K * G]`.
    """
    _check_inputs(x, weight, supports, bias)
    if x.is_cuda and _KERNELS is not None and _KERNELS.is_available() and _KERNELS.has_fast_path(x, weight):
        # Tensor-core shapes only (bf16 / fp16, G % 16 == 0, F % 32 == 0): elsewhere the kernels' generic
        # path is no faster than this file's. They take int32 supports and contiguous weights (no-ops for
        # a model's own tensors) and add the bias in their epilogue; determinism follows
        # `torch.use_deterministic_algorithms`.
        return _KERNELS.group_sparse_linear(x, weight.contiguous(), supports.to(torch.int32), bias)
    out = _GroupSparseLinearFunction.apply(x, weight, supports)
    return out if bias is None else out + bias


def merge_topk(best: tuple[torch.Tensor, torch.Tensor], candidates: tuple[torch.Tensor, torch.Tensor], k: int):
    """The `k` best of two (scores `[B, *]`, ids `[B, *]`) sets, best first."""
    scores = torch.cat([best[0], candidates[0]], dim=1)
    scores, top = scores.topk(min(k, scores.shape[1]), dim=1)
    return scores, torch.cat([best[1], candidates[1]], dim=1).gather(1, top)


def group_sparse_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    valid_count: int,
    chunk_elements: int = 1 << 24,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` best fp32 scores of each row of `group_sparse_linear(x, weight, supports, bias)` among its
    columns `[0, valid_count)`, and those columns, best first, without the `[B, K * G]` logits: fused into
    the forward kernel on tensor-core shapes, else scored `chunk_elements` logits at a time."""
    _check_inputs(x, weight, supports, bias)
    if x.is_cuda and _KERNELS is not None and _KERNELS.is_available() and _KERNELS.has_fast_path(x, weight):
        return _KERNELS.group_sparse_topk(x, weight.contiguous(), supports.to(torch.int32), bias, k, valid_count)
    batch_size = x.shape[0]
    num_groups, group_size = weight.shape[:2]
    best = (x.new_empty(batch_size, 0, dtype=torch.float32), x.new_empty(batch_size, 0, dtype=torch.int64))
    for chunk in chunks(num_groups, batch_size * group_size, chunk_elements):
        start, stop = chunk.start, chunk.stop
        columns = torch.arange(start * group_size, stop * group_size, device=x.device)
        chunk_bias = None if bias is None else bias[start * group_size : stop * group_size]
        logits = group_sparse_linear(x, weight[start:stop], supports[start:stop], chunk_bias).float()
        logits = logits.masked_fill(columns >= valid_count, float("-inf"))
        scores, top = logits.topk(min(k, logits.shape[1]), dim=1)
        best = merge_topk(best, (scores, columns[top]), k)
    return best


class GroupSparseLinear(nn.Module):
    """The sparse tail: `group_count` groups of `group_size` labels, each group reading `fan_in` of the
    `in_features` inputs through its support (`supports[k]`, distinct int32 indices)."""

    def __init__(
        self,
        in_features: int,
        group_count: int,
        group_size: int,
        fan_in: int,
        bias: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.in_features = in_features
        self.weight = nn.Parameter(torch.empty(group_count, group_size, fan_in, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(group_count * group_size, device=device, dtype=dtype)) if bias else None
        self.register_buffer("supports", torch.empty(group_count, fan_in, dtype=torch.int32, device=device))

    @property
    def out_features(self) -> int:
        return self.weight.shape[0] * self.weight.shape[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return group_sparse_linear(x, self.weight, self.supports, self.bias)

    def initial_weights(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight bound 1/sqrt(F), supports drawn from `seed`): what a new tail starts from."""
        groups, _, fan_in = self.weight.shape
        return 1.0 / math.sqrt(fan_in), random_supports(groups, fan_in, self.in_features, seed)

    def extra_repr(self) -> str:
        groups, group_size, fan_in = self.weight.shape
        return f"in_features={self.in_features}, groups={groups}, group_size={group_size}, fan_in={fan_in}, bias={self.bias is not None}"
