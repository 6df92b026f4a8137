# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste_hf.kernels.triton.forward` against the float64 reference (GPU, or CPU through Triton's interpreter)."""

import os
import subprocess
import sys

import pytest
import torch
from kernel_operands import TOLERANCE, make_layer, reference_logits, relative_error

from haste_hf.kernels.triton import forward


# (B, d, K, G, F): tensor-core shapes, ragged batches and a run of groups past K (K = 40), G = 48 and F = 96
# (padded to powers of two), then shapes off the tensor cores (any G, F >= 1).
SMALL_SHAPES = [
    (70, 96, 40, 32, 64, torch.bfloat16),
    (33, 100, 3, 16, 32, torch.float16),
    (5, 130, 7, 48, 96, torch.bfloat16),
    (9, 40, 6, 5, 7, torch.float32),
    (3, 12, 2, 1, 1, torch.float32),
]
GPU_SHAPES = [
    (300, 768, 121, 48, 64),
    (97, 1400, 11, 16, 128),
    (1, 300, 1, 64, 128),
    (256, 768, 2500, 64, 32),
    (129, 4000, 50, 16, 256),
    (40, 96, 6, 20, 33),
]


def check(shape, dtype, device, seed, bias=True):
    x, weight, supports, bias_tensor = make_layer(*shape, dtype, device, seed, bias)
    out = forward.forward(x, weight, supports, bias_tensor)
    assert out.dtype == dtype and out.shape == (shape[0], shape[2] * shape[3])
    assert torch.isfinite(out).all()
    error = relative_error(out, reference_logits(x, weight, supports, bias_tensor))
    assert error < TOLERANCE[dtype], f"relative error {error:.2e}"


@pytest.mark.parametrize("shape", SMALL_SHAPES, ids=lambda s: "B{}-d{}-K{}-G{}-F{}-{}".format(*s))
def test_matches_reference(device, shape):
    check(shape[:5], shape[5], device, seed=sum(shape[:5]), bias=shape[0] % 2 == 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "B{}-d{}-K{}-G{}-F{}".format(*s))
def test_matches_reference_on_gpu(shape, dtype):
    check(shape, dtype, "cuda", seed=sum(shape))


def test_empty_and_featureless_layers(device):
    x, weight, supports, bias = make_layer(4, 8, 3, 16, 32, torch.float32, device, seed=1)
    assert forward.forward(x[:0], weight, supports, bias).shape == (0, 48)
    empty = forward.forward(x, weight[:, :, :0], supports[:, :0], bias)
    torch.testing.assert_close(empty, bias.expand(4, 48))


def test_strided_bias(device):
    x, weight, supports, bias = make_layer(9, 64, 4, 16, 32, torch.bfloat16, device, seed=2)
    strided = torch.stack([bias, -bias], dim=1)[:, 0]  # the values of `bias`, every other element of a buffer
    assert not strided.is_contiguous()
    torch.testing.assert_close(
        forward.forward(x, weight, supports, strided), forward.forward(x, weight, supports, bias)
    )


COMPILE_WITH_ONES = """
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile
from haste_hf.kernels.triton import forward

pointers = {"xt_ptr": "*bf16", "weight_ptr": "*bf16", "supports_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*bf16"}
constants = dict(B=1, Bp=64, K=1, packs=1, packs_per_program=1, G=64, F=128, BLOCK_B=64, BLOCK_G=64, BLOCK_F=128,
                 PACK=1, HAS_BIAS=True, IEEE=False)
source = ASTSource(forward._forward_kernel, {**pointers, **dict.fromkeys(constants, "constexpr")}, constants)
kernel = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
assert ".entry _forward_kernel" in kernel.asm["ptx"]
"""


def test_compiles_for_hopper_when_arguments_are_one():
    """Triton passes an integer argument equal to 1 as a constant (K = 1 group, one pack per program): the kernel
    must compile then too. Compiled for sm_90 without a GPU (Triton's own ptxas), outside the interpreter."""
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE_WITH_ONES], env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
