# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste_hf.kernels.triton.positive_mask`: the positives as bits (GPU, or CPU through Triton's interpreter)."""

import torch

from haste_hf.kernels.triton import positive_mask


def test_positive_mask(device):
    positions = torch.tensor([[0, 33, 33, -1, 70, 31], [69, 64, 5, 71, 100, 2]], device=device)
    mask = positive_mask.positive_mask(positions, 72, 70).cpu().view(torch.uint32).long()
    expected = torch.tensor([[1 | 1 << 31, 1 << 1, 0], [1 << 2 | 1 << 5, 0, 1 << 0 | 1 << 5]])
    assert torch.equal(mask, expected)
