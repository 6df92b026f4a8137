# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`torch.library.opcheck` on every custom op of the package (the `haste::` ops of `haste_hf.kernels.ops`).

opcheck runs each op on real inputs and checks what `torch.compile` and autograd rely on: the schema
(no undeclared mutation or aliasing), the autograd registration, the fake implementation against the real
output (shape, dtype, strides) and the op under AOT dispatch with dynamic shapes, backward included.

The ops have only CUDA kernels. On CPU each op gets, for the duration of the CPU tests, a kernel written
here from the pure-PyTorch definition of what it computes: opcheck then exercises the package's own fake
implementations and autograd formulas (the backward of `group_sparse_forward` and `linear_loss` calls the
gradient ops) without a GPU. The GPU tests run opcheck on each backend's kernels themselves (Triton, the CUDA build).
"""

import pytest
import torch

from haste_hf.kernels import ops as kernels
from haste_hf.modeling import losses, sparse_ops


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ------------------------------------------------------------------------------------------------
# What each op computes, in plain PyTorch (the CPU kernels of the CPU tests).
# ------------------------------------------------------------------------------------------------
def _gathered(x, supports):
    return x[:, supports.long()]  # [B, K, F]


def _sparse_logits(x, weight, supports):
    return torch.einsum("bkf,kgf->bkg", _gathered(x, supports), weight).reshape(x.shape[0], -1)


def forward_reference(x, weight, supports, bias, deterministic):
    logits = _sparse_logits(x, weight, supports)
    return (logits if bias is None else logits + bias).contiguous()


def grad_weight_reference(grad_out, x, supports, group_size):
    grad_out = grad_out.view(x.shape[0], supports.shape[0], group_size)
    return torch.einsum("bkg,bkf->kgf", grad_out, _gathered(x, supports)).contiguous()


def grad_input_reference(grad_out, weight, supports, num_features, deterministic):
    grad_out = grad_out.view(grad_out.shape[0], *weight.shape[:2])
    per_support = torch.einsum("bkg,kgf->bkf", grad_out, weight).reshape(grad_out.shape[0], -1)
    grad_x = grad_out.new_zeros(grad_out.shape[0], num_features)
    return grad_x.index_add_(1, supports.long().flatten(), per_support)


def layer_logits(x, weight, bias, supports):
    logits = x @ weight.t() if supports is None else _sparse_logits(x, weight, supports)
    return logits if bias is None else logits + bias


def linear_loss_reference(
    x, weight, bias, supports, positions, valid_count, scale, loss, store_gradient, deterministic
):
    logits = layer_logits(x, weight, bias, supports).float()
    targets = losses.targets_of_chunk(positions, 0, logits.shape[1], valid_count, torch.float32)
    terms, grad = losses.LOSSES[loss](logits, targets)
    value = terms[:, :valid_count].sum() * scale
    grad[:, valid_count:] = 0.0
    grad_logits = (grad * scale).to(x.dtype) if store_gradient else x.new_empty(0, logits.shape[1])
    return value, grad_logits


def topk_reference(x, weight, supports, bias, k, valid_count):
    logits = layer_logits(x, weight, bias, supports).float()[:, :valid_count]
    scores, columns = logits.topk(min(k, valid_count), dim=1)
    padding = k - scores.shape[1]  # a row with fewer than k scored columns ends in (-inf, -1)
    scores = torch.cat([scores, scores.new_full((x.shape[0], padding), float("-inf"))], dim=1)
    return scores, torch.cat([columns, columns.new_full((x.shape[0], padding), -1)], dim=1)


CPU_KERNELS = {
    "group_sparse_forward": forward_reference,
    "group_sparse_grad_weight": grad_weight_reference,
    "group_sparse_grad_input": grad_input_reference,
    "linear_loss": linear_loss_reference,
    "group_sparse_topk": topk_reference,
}


def test_every_custom_op_of_the_package_is_checked():
    packets = {name: getattr(torch.ops.haste, name) for name in dir(torch.ops.haste)}
    registered = {name for name, packet in packets.items() if isinstance(packet, torch._ops.OpOverloadPacket)}
    assert registered == set(CPU_KERNELS)


def test_ops_have_only_cuda_kernels(monkeypatch):
    """A CPU tensor that reaches an op stops at dispatch, naming the backend, instead of starting a CUDA build."""
    monkeypatch.setattr(kernels, "_load_extension", lambda: pytest.fail("a CPU call tried to load the CUDA kernels"))
    monkeypatch.setattr(kernels, "_load_triton", lambda: pytest.fail("a CPU call tried to load the Triton kernels"))
    x, weight, _, supports = random_layer(4, 16, 3, 8, 5, torch.float32, "cpu", seed=0)
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        torch.ops.haste.group_sparse_forward(x, weight, supports, None, False)


@pytest.fixture
def cpu_kernels():
    """The plain-PyTorch CPU kernels above, registered for the test that asks for them only: the library that
    holds them unregisters them when it is destroyed."""
    library = torch.library.Library("haste", "FRAGMENT")
    for name, kernel in CPU_KERNELS.items():
        torch.library.impl(f"haste::{name}", "cpu", kernel, lib=library)
    yield
    del library


# ------------------------------------------------------------------------------------------------
# Fresh random inputs
# ------------------------------------------------------------------------------------------------
def random_layer(batch, features, groups, group_size, fan_in, dtype, device, seed, bias=False, dense_outputs=None):
    """(x, weight, bias, supports) of a group-sparse `[K, G, F]` layer, or of a dense `[n, d]` one when
    `dense_outputs` is n (then supports is None)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, features, generator=generator)
    if dense_outputs is None:
        weight = torch.randn(groups, group_size, fan_in, generator=generator) / fan_in**0.5
        supports = torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)])
        supports, outputs = supports.to(device, torch.int32), groups * group_size
    else:
        weight = torch.randn(dense_outputs, features, generator=generator) / features**0.5
        supports, outputs = None, dense_outputs
    bias_tensor = torch.randn(outputs, generator=generator).to(device, dtype) if bias else None
    return x.to(device, dtype), weight.to(device, dtype), bias_tensor, supports


def random_positions(batch, outputs, device, seed):
    """Positive positions `[B, 6]` with -1 padding, a repeat and positions past the layer."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(-1, outputs + 4, (batch, 6), generator=generator)
    positions[0, 1] = positions[0, 0]
    return positions.to(device)


def requiring_grad(*tensors):
    return [tensor.requires_grad_() if tensor is not None else None for tensor in tensors]


def opcheck(op, args):
    # Tolerances of the eager / compiled comparison: bf16 rounds the fused sums in another order.
    tolerance = {"atol": 2e-2, "rtol": 2e-2} if args[0].dtype != torch.float32 else {}
    torch.library.opcheck(op, args, **tolerance)


# (B, d, K, G, F, dtype): on CUDA the first two take the tensor-core path, the last the generic kernels.
SPARSE_SHAPES = [
    (33, 96, 5, 32, 64, torch.bfloat16),
    (17, 130, 7, 16, 32, torch.float16),
    (9, 40, 6, 5, 7, torch.float32),
]


def shape_id(shape):
    return "-".join(str(value).replace("torch.", "") for value in shape)


def check_sparse_ops(shape, device, bias, deterministic, seed):
    batch, features, groups, group_size, fan_in, dtype = shape
    x, weight, bias_tensor, supports = random_layer(
        batch, features, groups, group_size, fan_in, dtype, device, seed, bias
    )
    grad_out = torch.randn(batch, groups * group_size, device=device).to(dtype)
    opcheck(torch.ops.haste.group_sparse_forward.default, (x, weight, supports, bias_tensor, deterministic))
    x, weight, bias_tensor = requiring_grad(x, weight, bias_tensor)
    opcheck(torch.ops.haste.group_sparse_forward.default, (x, weight, supports, bias_tensor, deterministic))
    opcheck(torch.ops.haste.group_sparse_grad_weight.default, (grad_out, x.detach(), supports, group_size))
    grad_input_arguments = (grad_out, weight.detach(), supports, features, deterministic)
    opcheck(torch.ops.haste.group_sparse_grad_input.default, grad_input_arguments)


def check_linear_loss(kind, loss, store_gradient, device, dtype, seed):
    if kind == "dense":
        x, weight, bias, supports = random_layer(21, 48, None, None, None, dtype, device, seed, True, dense_outputs=77)
    else:
        x, weight, bias, supports = random_layer(21, 96, 3, 32, 64, dtype, device, seed, True)
    outputs = bias.shape[0]
    positions = random_positions(x.shape[0], outputs, device, seed)
    if store_gradient:
        x, weight, bias = requiring_grad(x, weight, bias)
    arguments = (x, weight, bias, supports, positions, outputs - 3, 0.25, loss, store_gradient, False)
    opcheck(torch.ops.haste.linear_loss.default, arguments)


def check_topk(k, device, dtype, seed):
    x, weight, bias, supports = random_layer(19, 96, 2, 32, 64, dtype, device, seed, bias=True)
    opcheck(torch.ops.haste.group_sparse_topk.default, (x, weight, supports, bias, k, 60))


# ------------------------------------------------------------------------------------------------
# CPU: the fake implementations and autograd formulas, on the plain-PyTorch kernels
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_sparse_linear_ops_on_cpu(cpu_kernels, bias):
    check_sparse_ops((9, 40, 6, 5, 7, torch.float32), "cpu", bias, deterministic=bias, seed=int(bias))


@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("store_gradient", [True, False], ids=["autograd", "no-grad"])
def test_linear_loss_on_cpu(cpu_kernels, kind, store_gradient):
    check_linear_loss(kind, "bce", store_gradient, "cpu", torch.float32, seed=2 + store_gradient)


def test_topk_on_cpu(cpu_kernels):
    check_topk(5, "cpu", torch.float32, seed=4)
    check_topk(70, "cpu", torch.float32, seed=5)  # more than the 60 scored columns: padded


def test_autograd_formulas_are_the_derivatives_on_cpu(cpu_kernels):
    """opcheck compares the registered backward with itself under compilation; this checks that it is the
    derivative of what the op computes (float64 finite differences for the layer, float64 autograd of the
    materialised logits for the loss, whose value is fp32 by contract)."""
    sparse = random_layer(5, 12, 3, 2, 4, torch.float64, "cpu", seed=10, bias=True)
    dense = random_layer(5, 12, None, None, None, torch.float64, "cpu", seed=11, bias=True, dense_outputs=6)
    for deterministic in (False, True):

        def forward(x, weight, bias, deterministic=deterministic):
            return torch.ops.haste.group_sparse_forward(x, weight, sparse[3], bias, deterministic)

        assert torch.autograd.gradcheck(forward, requiring_grad(*sparse[:3]))
    positions = random_positions(5, 6, "cpu", seed=10)
    for x, weight, bias, supports in (sparse, dense):
        layer = requiring_grad(x, weight, bias)
        value, _ = torch.ops.haste.linear_loss(*layer, supports, positions, 5, 0.25, "bce", True, False)
        logits = layer_logits(*layer, supports)
        terms, _ = losses.bce(logits, losses.targets_of_chunk(positions, 0, 6, 5, torch.float64))
        expected = torch.autograd.grad(terms[:, :5].sum() * 0.25, layer)
        torch.testing.assert_close(torch.autograd.grad(value, layer), expected)


def test_cpu_kernels_are_the_reference_of_the_package():
    """The CPU kernels above are the package's own PyTorch path: sparse_ops and the chunked loss."""
    x, weight, bias, supports = random_layer(9, 40, 6, 5, 7, torch.float64, "cpu", seed=6, bias=True)
    torch.testing.assert_close(
        forward_reference(x, weight, supports, bias, False), sparse_ops.group_sparse_linear(x, weight, supports, bias)
    )
    positions = random_positions(9, 30, "cpu", seed=6)
    value, _ = linear_loss_reference(x, weight, bias, supports, positions, 27, 0.25, "squared_hinge", False, False)
    chunked = losses._ChunkedLinearLoss.apply(
        x, weight, bias, supports, positions, 27, 0.25, "squared_hinge", 0, None, False
    )
    torch.testing.assert_close(value.double(), chunked)
    x, weight = requiring_grad(x, weight)
    grad_out = torch.randn(9, 30, dtype=torch.float64)
    grad_x, grad_weight = torch.autograd.grad(
        sparse_ops.group_sparse_linear(x, weight, supports, None), (x, weight), grad_out
    )
    torch.testing.assert_close(grad_input_reference(grad_out, weight.detach(), supports, 40, False), grad_x)
    torch.testing.assert_close(grad_weight_reference(grad_out, x.detach(), supports, 5), grad_weight)


# ------------------------------------------------------------------------------------------------
# GPU: the CUDA kernels
# ------------------------------------------------------------------------------------------------
@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("shape", SPARSE_SHAPES, ids=shape_id)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
def test_sparse_linear_ops_on_gpu(shape, bias, deterministic, backend):
    assert kernels.is_available()
    check_sparse_ops(shape, "cuda", bias, deterministic, seed=shape[0] + bias)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("store_gradient", [True, False], ids=["autograd", "no-grad"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_linear_loss_on_gpu(kind, loss, store_gradient, dtype, backend):
    assert kernels.is_available()
    check_linear_loss(kind, loss, store_gradient, "cuda", dtype, seed=7)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_topk_on_gpu(dtype, backend):
    assert kernels.is_available()
    check_topk(5, "cuda", dtype, seed=8)
    check_topk(70, "cuda", dtype, seed=9)
