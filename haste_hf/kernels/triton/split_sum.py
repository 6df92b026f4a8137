# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The last step of the feature gradient (`grad_input.py`): its fp32 accumulator `[splits, d, B]` summed over the
splits in their order (the same bits on every run) and transposed to `[B, d]` in the operands' dtype."""

import torch
import triton
import triton.language as tl

from .device import on_device


@triton.jit
def _reduce_transpose_kernel(
    acc_ptr,  # fp32 [splits, d, B]
    grad_x_ptr,  # [B, d]
    batch,
    num_features,
    splits,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    features = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (features[:, None] < num_features) & (rows[None, :] < batch)
    offsets = features[:, None] * batch + rows[None, :]
    total = tl.zeros((BLOCK_D, BLOCK_B), dtype=tl.float32)
    split_size = num_features.to(tl.int64) * batch
    for _ in range(splits):  # a fixed order: the same sum on every run
        total += tl.load(acc_ptr + offsets, mask=mask, other=0.0)
        acc_ptr += split_size
    out = grad_x_ptr + rows[None, :].to(tl.int64) * num_features + features[:, None]
    tl.store(out, total.to(grad_x_ptr.dtype.element_ty), mask=mask)


def sum_splits_transposed(acc: torch.Tensor, grad_x: torch.Tensor) -> torch.Tensor:
    """Writes the sum over the first axis of `acc` `[splits, d, B]` (fp32), transposed, into `grad_x` `[B, d]`."""
    splits, num_features, batch = acc.shape
    block_d, block_b = 32, 64
    with on_device(acc):
        _reduce_transpose_kernel[(triton.cdiv(num_features, block_d), triton.cdiv(batch, block_b))](
            acc, grad_x, batch, num_features, splits, BLOCK_D=block_d, BLOCK_B=block_b, num_warps=4
        )
    return grad_x


__all__ = ["sum_splits_transposed"]
