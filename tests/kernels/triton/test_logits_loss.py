# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste_hf.kernels.triton.logits_loss` (the fused loss on materialised logits) against the float64 reference (GPU, or
CPU through Triton's interpreter). Its dense layers through `linear_loss`: test_loss.py."""

import torch

from haste_hf.kernels.ops import LOSS_KINDS
from haste_hf.kernels.triton import logits_loss, positive_mask
from haste_hf.modeling import losses


def test_bce_is_accurate_over_the_logit_range(device):
    """softplus and sigmoid from one exponential: relative error ~1e-6 against float64 over [-40, 40]."""
    logits64 = torch.linspace(-40, 40, 4001, dtype=torch.float64).reshape(1, -1)
    positions = torch.arange(0, 4001, 3).reshape(1, -1).to(device)
    mask = positive_mask.positive_mask(positions, 4001, 4001)
    logits = logits64.float().to(device)
    value = logits_loss.logits_loss_(logits, mask, 4001, 1.0, LOSS_KINDS["bce"], store=True)
    targets = losses.targets_of_chunk(positions.cpu(), 0, 4001, 4001, torch.float64)
    terms, grad = losses.bce(logits64.float().double(), targets)
    assert abs(value.item() - terms.sum().item()) <= 1e-6 * terms.sum().item()
    torch.testing.assert_close(logits.double().cpu(), grad, rtol=1e-5, atol=1e-7)
