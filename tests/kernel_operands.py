# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Fresh random operands of the tail, their float64 reference and the shapes and tolerances of the kernels' tests."""

import torch


# Relative Frobenius error allowed against a float64 reference, per dtype (fp32 multiplies in true fp32).
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}

# (B, d, K, G, F) of the GPU tests: tensor-core shapes (G % 16 == 0, F % 32 == 0) with batches that are not
# multiples of the tiles, K = 1, G = 48 (not a power of two: a 16-label remainder, groups straddling the tiles),
# then shapes off the tensor cores (any G, F), which the masks serve.
GPU_SHAPES = [
    (64, 768, 40, 32, 64),
    (70, 768, 33, 16, 32),
    (300, 768, 121, 48, 64),
    (1, 300, 1, 64, 128),
    (129, 200, 7, 48, 96),
    (256, 768, 25, 64, 32),
    (33, 100, 9, 8, 32),
    (17, 64, 5, 3, 7),
    (5, 50, 4, 1, 1),
]


def make_layer(batch, features, groups, group_size, fan_in, dtype, device, seed, bias=True):
    """(x, weight, supports, bias) of a group-sparse layer, random (never zeros), on `device`."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, features, generator=generator)
    weight = torch.randn(groups, group_size, fan_in, generator=generator) / fan_in**0.5
    supports = torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)])
    bias_tensor = torch.randn(groups * group_size, generator=generator).to(device, dtype) if bias else None
    return x.to(device, dtype), weight.to(device, dtype), supports.to(device, torch.int32), bias_tensor


def reference_logits(x, weight, supports, bias):
    """float64 logits `[B, K * G]` (+ bias)."""
    gathered = x.double()[:, supports.long()]  # [B, K, F]
    logits = torch.einsum("bkf,kgf->bkg", gathered, weight.double()).reshape(x.shape[0], -1)
    return logits if bias is None else logits + bias.double()


def relative_error(actual, expected):
    actual, expected = actual.double().cpu(), expected.double().cpu()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def random_positions(batch, outputs, device, seed, count=6):
    """Positive positions `[B, count]` with -1 padding, a repeat and positions past the layer."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(-1, outputs + 4, (batch, count), generator=generator)
    positions[0, 1] = positions[0, 0]
    return positions.to(device)
