# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste_hf.kernels.triton.loss` (the fused loss: the tail's epilogue and the elementwise pass on a dense head's
logits) against the float64 reference (GPU, or CPU through Triton's interpreter)."""

import pytest
import torch
from kernel_operands import TOLERANCE, make_layer, random_positions, reference_logits, relative_error

from haste_hf.kernels.triton import loss as fused
from haste_hf.modeling import losses


def reference(logits64, dtype, positions, valid_count, scale, loss):
    """(loss, gradient in `dtype`) of logits rounded to the layer's dtype, as the kernels see them."""
    logits = logits64.to(dtype).double()
    targets = losses.targets_of_chunk(positions.cpu(), 0, logits.shape[1], valid_count, torch.float64)
    terms, grad = losses.LOSSES[loss](logits.cpu(), targets)
    grad[:, valid_count:] = 0.0
    return terms[:, :valid_count].sum() * scale, (grad * scale).to(dtype)


def check(layer, positions, valid_count, loss, store, dtype):
    x, weight, supports, bias = layer
    scale = 0.37
    value, grad = fused.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss, store)
    if supports is None:
        logits64 = x.double() @ weight.double().t() + bias.double()
    else:
        logits64 = reference_logits(x, weight, supports, bias)
    expected_value, expected_grad = reference(logits64, dtype, positions, valid_count, scale, loss)
    assert value.dtype == torch.float32 and value.shape == ()
    assert abs(value.item() - expected_value.item()) <= 1e-4 * abs(expected_value.item()) + 1e-6
    if not store:
        assert grad.shape == (0, logits64.shape[1])
        return
    assert grad.dtype == dtype and torch.isfinite(grad).all()
    assert (grad[:, valid_count:] == 0).all()
    error = relative_error(grad, expected_grad)
    assert error < TOLERANCE[dtype], f"gradient: relative error {error:.2e}"
    again = fused.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss, store)
    assert torch.equal(again[0], value) and torch.equal(again[1], grad)


# The epilogue reads the positives' mask one word per row for packs of 32 columns (G = 32; G = 16 packed two to a
# dot), of 64 (G = 64: two words), of 16 (G = 16 alone at F = 128: half a word), and one word per logit otherwise.
SPARSE = [
    (21, 96, 40, 32, 64, torch.bfloat16),
    (9, 40, 6, 5, 7, torch.float32),
    (33, 100, 3, 16, 32, torch.float16),
    (12, 160, 5, 64, 32, torch.bfloat16),
    (10, 200, 5, 16, 128, torch.bfloat16),
]


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("store", [True, False], ids=["store", "no-store"])
@pytest.mark.parametrize("shape", SPARSE, ids=lambda s: "B{}-d{}-K{}-G{}-F{}-{}".format(*s))
def test_sparse_layer(device, shape, loss, store):
    batch, _, groups, group_size = shape[:4]
    layer = make_layer(*shape, device, seed=sum(shape[:5]))
    positions = random_positions(batch, groups * group_size, device, seed=batch, count=9)
    check(layer, positions, groups * group_size - 3, loss, store, shape[5])


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_dense_layer(device, loss, dtype):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(13, 48, generator=generator).to(device, dtype)
    weight = (torch.randn(4100, 48, generator=generator) / 7).to(device, dtype)  # two column blocks per row
    bias = torch.randn(4100, generator=generator).to(device, dtype)
    positions = random_positions(13, 4100, device, seed=4, count=40)
    for store in (True, False):
        check((x, weight, None, bias), positions, 4090, loss, store, dtype)


def test_bce_is_accurate_over_the_logit_range(device):
    """softplus and sigmoid from one exponential: relative error ~1e-6 against float64 over [-40, 40]."""
    logits64 = torch.linspace(-40, 40, 4001, dtype=torch.float64).reshape(1, -1)
    positions = torch.arange(0, 4001, 3).reshape(1, -1).to(device)
    mask = fused.positive_mask(positions, 4001, 4001)
    logits = logits64.float().to(device)
    value = fused.logits_loss_(logits, mask, 4001, 1.0, "bce", store=True)
    targets = losses.targets_of_chunk(positions.cpu(), 0, 4001, 4001, torch.float64)
    terms, grad = losses.bce(logits64.float().double(), targets)
    assert abs(value.item() - terms.sum().item()) <= 1e-6 * terms.sum().item()
    torch.testing.assert_close(logits.double().cpu(), grad, rtol=1e-5, atol=1e-7)


def test_positive_mask(device):
    positions = torch.tensor([[0, 33, 33, -1, 70, 31], [69, 64, 5, 71, 100, 2]], device=device)
    mask = fused.positive_mask(positions, 72, 70).cpu().view(torch.uint32).long()
    expected = torch.tensor([[1 | 1 << 31, 1 << 1, 0], [1 << 2 | 1 << 5, 0, 1 << 0 | 1 << 5]])
    assert torch.equal(mask, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_sparse_layer_on_gpu(loss, dtype):
    shape = (300, 768, 900, 32, 64)
    layer = make_layer(*shape, dtype, "cuda", seed=11)
    positions = random_positions(300, 900 * 32, "cuda", seed=12, count=30)
    check(layer, positions, 900 * 32 - 17, loss, True, dtype)
