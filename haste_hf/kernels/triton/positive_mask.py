# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The positives of a batch as a bit mask for the fused loss's epilogues: per-row positions `[B, P]` (any order,
repeats, -1 padding, columns past the layer) to bits `[B, ceil(n / 32)]` int32, bit c of word w for column 32 w + c."""

import torch
import triton
import triton.language as tl

from .device import on_device


_BLOCK = 1024


@triton.jit
def _positive_mask_kernel(positions_ptr, count, P, valid_count, mask_ptr, words, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    position = tl.load(positions_ptr + index, mask=index < count, other=-1)
    inside = (index < count) & (position >= 0) & (position < valid_count)
    row = index // P
    bit = (1 << (position % 32)).to(tl.int32)
    tl.atomic_or(mask_ptr + row * words + position // 32, bit, mask=inside)


def positive_mask(positions: torch.Tensor, outputs: int, valid_count: int) -> torch.Tensor:
    """Bits `[B, ceil(outputs / 32)]` int32 (bit c of word w: column 32 w + c) of the positions in `[0, valid_count)`."""
    batch = positions.shape[0]
    words = triton.cdiv(max(outputs, 1), 32)
    mask = torch.zeros(batch, words, dtype=torch.int32, device=positions.device)
    positions = positions.to(torch.int64).contiguous()
    count = positions.numel()
    if count > 0:
        with on_device(positions):
            _positive_mask_kernel[(triton.cdiv(count, _BLOCK),)](
                positions, count, positions.shape[1], valid_count, mask, words, BLOCK=_BLOCK
            )
    return mask


__all__ = ["positive_mask"]
