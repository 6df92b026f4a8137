# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The fused Triton update of `StochasticRoundingSGD` for contiguous bf16 CUDA parameters.

One pass over memory reads each weight, gradient and momentum value once, updates in float32 and stores
the weight (and a bf16 buffer) by stochastic rounding with bits from Triton's Philox. Guarded: without
Triton, `is_available()` is False and `haste_hf.training.optimization` runs its PyTorch update, which computes the
same update everywhere.
"""

import hashlib

import torch

from ..import_utils import is_triton_available


if is_triton_available():
    import triton
    import triton.language as tl
else:
    triton = None


# Triton's Philox takes 32-bit offsets: larger tensors are updated in slices with a seed each.
_SLICE_ELEMENTS = 1 << 30
_BLOCK = 1024


def is_available() -> bool:
    return triton is not None


def _slice_seed(seed: int, index: int) -> int:
    """A seed per slice of a parameter, in 63 bits (Triton takes a signed 64-bit seed)."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


if triton is not None:

    @triton.jit
    def _stochastic_round(values, noise):
        bits = values.to(tl.int32, bitcast=True) + noise.to(tl.int32)
        rounded = (bits & -65536).to(tl.float32, bitcast=True)
        return tl.where(values != values, values, rounded).to(tl.bfloat16)

    @triton.jit
    def _bfloat16_sgd_kernel(
        param_ptr,
        grad_ptr,
        buffer_ptr,
        numel,
        lr,
        momentum,
        decay,
        seed,
        HAS_MOMENTUM: tl.constexpr,
        FIRST_STEP: tl.constexpr,
        NESTEROV: tl.constexpr,
        BUFFER_BF16: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        in_range = offsets < numel
        grad = tl.load(grad_ptr + offsets, mask=in_range, other=0.0).to(tl.float32)
        random = tl.randint(seed, offsets).to(
            tl.uint32, bitcast=True
        )  # 32 bits: the low half rounds the weight, the high half the buffer
        direction = grad
        if HAS_MOMENTUM:
            if FIRST_STEP:
                average = grad
            else:
                average = tl.load(buffer_ptr + offsets, mask=in_range, other=0.0).to(tl.float32) * momentum + grad
            if BUFFER_BF16:
                tl.store(buffer_ptr + offsets, _stochastic_round(average, random >> 16), mask=in_range)
            else:
                tl.store(buffer_ptr + offsets, average, mask=in_range)
            if NESTEROV:
                direction = grad + momentum * average
            else:
                direction = average
        weights = tl.load(param_ptr + offsets, mask=in_range, other=0.0).to(tl.float32) * decay - lr * direction
        tl.store(param_ptr + offsets, _stochastic_round(weights, random & 0xFFFF), mask=in_range)


def fused_bfloat16_sgd_(param, grad, buffer, group, first_momentum_step: bool, seed: int) -> None:
    """`StochasticRoundingSGD`'s update of a contiguous bf16 CUDA parameter by its contiguous gradient `grad`
    (and its momentum `buffer`, float32 or bf16, or None without momentum) with the hyperparameters of `group`.

    Same arithmetic as the PyTorch path up to float32 rounding (the compiler may fuse multiply-adds) and
    with random bits from Triton's Philox, counter-based on ``(seed, element)``.
    """
    if triton is None:
        raise RuntimeError("The fused SGD update needs Triton (`pip install triton`).")
    flat_param, flat_grad = param.view(-1), grad.view(-1)
    flat_buffer = flat_param if buffer is None else buffer.view(-1)  # never read without momentum
    with torch.cuda.device(param.device):
        for index, start in enumerate(range(0, flat_param.numel(), _SLICE_ELEMENTS)):
            stop = min(start + _SLICE_ELEMENTS, flat_param.numel())
            grid = (triton.cdiv(stop - start, _BLOCK),)
            _bfloat16_sgd_kernel[grid](
                flat_param[start:stop],
                flat_grad[start:stop],
                flat_buffer[start:stop],
                stop - start,
                group["lr"],
                group["momentum"],
                1.0 - group["lr"] * group["weight_decay"],
                _slice_seed(seed, index),
                HAS_MOMENTUM=buffer is not None,
                FIRST_STEP=first_momentum_step,
                NESTEROV=group["nesterov"],
                BUFFER_BF16=buffer is not None and buffer.dtype == torch.bfloat16,
                BLOCK=_BLOCK,
            )


__all__ = ["fused_bfloat16_sgd_", "is_available"]
