# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The losses' elementwise terms, shared by the fused loss kernels (`loss.py`, `logits_loss.py`): the loss of a logit
against a 0/1 target and its derivative, in fp32."""

import torch
import triton
import triton.language as tl


def fast_log(tensor: torch.Tensor) -> bool:
    """Whether kernels on this tensor's device may use NVIDIA's `lg2.approx` (`natural_log`'s FAST_LOG)."""
    return tensor.is_cuda and torch.version.hip is None


@triton.jit
def natural_log(t, FAST_LOG: tl.constexpr):
    """log(t) of positive normal fp32 t. FAST_LOG (NVIDIA GPUs): the hardware's base-2 logarithm (`lg2.approx`, one
    instruction, absolute error ~4e-7 for t in [1, 2], as CUDA's `__logf`); else `tl.log`, a branching software
    routine of ~30 instructions per element that made the fused loss 2x slower (and the only choice of Triton's
    interpreter and of other GPUs)."""
    if FAST_LOG:
        log2 = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [t], dtype=tl.float32, is_pure=True, pack=1)
        return log2 * 0.6931471805599453
    else:
        return tl.log(t)


@triton.jit
def loss_and_gradient(z, y, LOSS: tl.constexpr, FAST_LOG: tl.constexpr):
    """Loss of logits z against 0/1 targets y and its derivative in z (fp32, elementwise)."""
    if LOSS == 0:
        # softplus(z) - y z and sigmoid(z) - y from e = exp(-|z|) in (0, 1]: no overflow at any z. log1p(e) by its
        # series below 1/16 (relative error < e^5 / 6), else log(1 + e) (absolute error < 1e-6 on a value >= 0.06).
        e = tl.exp(-tl.abs(z))
        series = e * (1.0 - e * (0.5 - e * (1.0 / 3.0 - e * (0.25 - e * 0.2))))
        log1p_e = tl.where(e < 0.0625, series, natural_log(1.0 + e, FAST_LOG))
        inverse = 1.0 / (1.0 + e)
        loss = tl.maximum(z, 0.0) + log1p_e - y * z
        gradient = tl.where(z >= 0.0, inverse, e * inverse) - y
    else:
        sign = 2.0 * y - 1.0
        margin = tl.maximum(1.0 - sign * z, 0.0)
        loss = margin * margin
        gradient = -2.0 * sign * margin
    return loss, gradient


__all__ = ["fast_log", "loss_and_gradient", "natural_log"]
