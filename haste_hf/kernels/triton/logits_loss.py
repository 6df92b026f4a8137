# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The fused loss of materialised logits (a dense head's, from cuBLAS): one elementwise pass that sums the loss
(one fp64 slot per program, added by PyTorch: the same bits run to run) and overwrites the logits with
`scale * dloss/dz` for the backward."""

import torch
import triton
import triton.language as tl

from .device import on_device
from .loss_terms import fast_log, loss_and_gradient


_BLOCK = 2048


@triton.jit
def _logits_loss_kernel(
    logits_ptr,
    mask_ptr,
    partials_ptr,
    n,
    blocks_per_row,
    words,
    valid_count,
    scale,
    LOSS: tl.constexpr,
    STORE: tl.constexpr,
    BLOCK: tl.constexpr,
    FAST_LOG: tl.constexpr,
):
    program = tl.program_id(0)
    row = (program // blocks_per_row).to(tl.int64)
    columns = (program % blocks_per_row).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = columns < n
    at = logits_ptr + row * n + columns
    z = tl.load(at, mask=inside, other=0.0).to(tl.float32)
    word = tl.load(mask_ptr + row * words + columns // 32, mask=inside, other=0)
    y = ((word >> (columns % 32).to(tl.int32)) & 1).to(tl.float32)
    loss, gradient = loss_and_gradient(z, y, LOSS, FAST_LOG)
    counted = inside & (columns < valid_count)
    tl.store(partials_ptr + program, tl.sum(tl.where(counted, loss, 0.0), axis=0).to(tl.float64))
    if STORE:
        tl.store(at, tl.where(counted, gradient * scale, 0.0).to(logits_ptr.dtype.element_ty), mask=inside)


def logits_loss_(
    logits: torch.Tensor, mask: torch.Tensor, valid_count: int, scale: float, loss_kind: int, store: bool
) -> torch.Tensor:
    """The loss (`loss_kind`: 0 BCE, 1 squared hinge) of materialised logits `[B, n]` (fp32 scalar, times `scale`)
    against the positives' bits (`positive_mask`); with `store` the logits are overwritten by `scale * dloss/dz` (0 at
    columns >= valid_count)."""
    batch, n = logits.shape
    blocks_per_row = triton.cdiv(n, _BLOCK)
    partials = torch.empty(batch * blocks_per_row, dtype=torch.float64, device=logits.device)
    with on_device(logits):
        _logits_loss_kernel[(batch * blocks_per_row,)](
            logits,
            mask,
            partials,
            n,
            blocks_per_row,
            mask.shape[1],
            valid_count,
            scale,
            LOSS=loss_kind,
            STORE=store,
            BLOCK=_BLOCK,
            FAST_LOG=fast_log(logits),
            num_warps=8,
        )
    return (partials.sum() * scale).float()


__all__ = ["logits_loss_"]
