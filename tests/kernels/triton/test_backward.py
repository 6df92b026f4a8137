# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The Triton backward kernels (`haste_hf.kernels.triton.grad_weight`, `.grad_input`) against the PyTorch path
of `haste_hf.modeling.sparse_ops` in float64.

On a GPU they run compiled; on a CPU through Triton's interpreter (`TRITON_INTERPRET=1`, set by
tests/conftest.py; this folder's conftest.py mends its bugs), on small shapes, fp32 and fp16 (bf16 on the GPU).
"""

import importlib

import pytest
import torch
from kernel_operands import GPU_SHAPES, TOLERANCE, relative_error

from haste_hf.modeling import sparse_ops


triton = pytest.importorskip("triton")

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")

MODULES = ("haste_hf.kernels.triton.grad_weight", "haste_hf.kernels.triton.grad_input")


@pytest.fixture(scope="module")
def kernels():
    """(grad_weight, grad_input): compiled on a GPU, interpreted on a CPU (tests/conftest.py sets
    `TRITON_INTERPRET=1` there before triton is imported)."""
    modules = [importlib.import_module(name) for name in MODULES]
    return modules[0].grad_weight, modules[1].grad_input


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Outputs the kernels allocate start as NaN, so that an element they do not write shows up."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() else tensor

    monkeypatch.setattr(torch, "empty", poisoned)


def make_operands(batch, features, groups, group_size, fan_in, dtype, seed):
    generator = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(batch, features, generator=generator).to(DEVICE, dtype)
    weight = (torch.randn(groups, group_size, fan_in, generator=generator) / fan_in**0.5).to(DEVICE, dtype)
    supports = torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)])
    grad_out = torch.randn(batch, groups * group_size, generator=generator).to(DEVICE, dtype)
    return x, weight, supports.to(DEVICE, torch.int32), grad_out


def reference_gradients(x, weight, supports, grad_out):
    """(grad_x, grad_weight) of the PyTorch path in float64."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    sparse_ops._GroupSparseLinearFunction.apply(x64, w64, supports.long()).backward(grad_out.double())
    return x64.grad, w64.grad


def check(name, actual, expected, dtype):
    assert actual.dtype == dtype, f"{name} in {actual.dtype}, expected {dtype}"
    assert torch.isfinite(actual).all(), f"{name} has unwritten (NaN) or non-finite elements"
    error = relative_error(actual, expected)
    assert error < TOLERANCE[dtype], f"{name}: relative error {error:.2e}"


CPU_SHAPES = [(37, 100, 5, 16, 32), (70, 130, 3, 48, 96), (20, 64, 4, 32, 64), (9, 40, 3, 3, 7)]
SHAPES = [*GPU_SHAPES, (97, 1600, 11, 16, 128)] if GPU else CPU_SHAPES  # and a wide d
DTYPES = [torch.bfloat16, torch.float16, torch.float32] if GPU else [torch.float16, torch.float32]
shape_ids = "B{}-d{}-K{}-G{}-F{}".format


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape_ids(*shape))
def test_grad_weight_matches_reference(kernels, poisoned_outputs, shape, dtype):
    grad_weight, _ = kernels
    x, weight, supports, grad_out = make_operands(*shape, dtype, seed=sum(shape))
    _, expected = reference_gradients(x, weight, supports, grad_out)
    check("grad_weight", grad_weight(grad_out, x, supports, shape[3]), expected, dtype)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: shape_ids(*shape))
def test_grad_input_matches_reference(kernels, poisoned_outputs, shape, dtype, deterministic):
    _, grad_input = kernels
    x, weight, supports, grad_out = make_operands(*shape, dtype, seed=sum(shape) + 1)
    expected, _ = reference_gradients(x, weight, supports, grad_out)
    check("grad_x", grad_input(grad_out, weight, supports, shape[1], deterministic), expected, dtype)


@pytest.mark.parametrize("groups_per_program", [1, 3, 10])
def test_grad_weight_runs_of_groups(kernels, poisoned_outputs, groups_per_program):
    """A batch of one chunk (fp32: B <= 32): runs of groups that do or do not divide K, supports in two
    feature tiles (F = 96 over G = 48); several chunks: one group a program whatever is asked."""
    grad_weight, _ = kernels
    for shape in ((20, 130, 10, 48, 96), (32, 64, 10, 16, 32), (150, 64, 10, 16, 32)):
        x, weight, supports, grad_out = make_operands(*shape, torch.float32, seed=groups_per_program)
        _, expected = reference_gradients(x, weight, supports, grad_out)
        check("grad_weight", grad_weight(grad_out, x, supports, shape[3], groups_per_program), expected, torch.float32)


@pytest.mark.parametrize("block_b, groups_per_program", [(16, 1), (32, 3), (64, 7)])
def test_grad_input_work_splits(kernels, poisoned_outputs, block_b, groups_per_program):
    """Every split of the work adds every group once: batch tiles of 16-64 rows, runs of groups that do or
    do not divide K, in both modes."""
    _, grad_input = kernels
    shape = (70, 96, 10, 16, 32)
    x, weight, supports, grad_out = make_operands(*shape, torch.float32, seed=block_b + groups_per_program)
    expected, _ = reference_gradients(x, weight, supports, grad_out)
    for deterministic in (False, True):
        actual = grad_input(grad_out, weight, supports, 96, deterministic, block_b, groups_per_program)
        check(f"grad_x (deterministic={deterministic})", actual, expected, torch.float32)


@pytest.mark.parametrize("pack", [2, 4])
def test_grad_input_packs_of_groups(kernels, poisoned_outputs, pack):
    """Fast mode with several groups a dot (block-diagonal weights): K that the packs do not divide, G and F that
    are not powers of two, runs of packs of any length; the deterministic mode refuses packs."""
    _, grad_input = kernels
    for shape in ((37, 100, 5, 16, 32), (20, 64, 7, 12, 20)):
        x, weight, supports, grad_out = make_operands(*shape, torch.float32, seed=pack + shape[2])
        expected, _ = reference_gradients(x, weight, supports, grad_out)
        for groups_per_program in (None, 1, 3):
            actual = grad_input(grad_out, weight, supports, shape[1], False, 16, groups_per_program, pack=pack)
            check(f"grad_x (groups_per_program={groups_per_program})", actual, expected, torch.float32)
    with pytest.raises(ValueError, match="`pack` must be 1"):
        grad_input(grad_out, weight, supports, shape[1], True, pack=pack)


@pytest.mark.parametrize("pack", [2, 4])
def test_grad_weight_packs_of_groups(kernels, poisoned_outputs, pack):
    """Several groups a dot, their diagonal blocks stored: a batch of one chunk (runs of packs) and of several
    (one pack a program), K that the packs do not divide, G and F that are not powers of two."""
    grad_weight, _ = kernels
    for shape in ((20, 64, 7, 16, 32), (70, 100, 5, 12, 20)):
        x, weight, supports, grad_out = make_operands(*shape, torch.float32, seed=pack + shape[0])
        _, expected = reference_gradients(x, weight, supports, grad_out)
        for groups_per_program in (None, 3):
            actual = grad_weight(grad_out, x, supports, shape[3], groups_per_program, block_b=32, pack=pack)
            check(f"grad_weight (groups_per_program={groups_per_program})", actual, expected, torch.float32)
    with pytest.raises(ValueError, match="one feature tile"):
        x, weight, supports, grad_out = make_operands(8, 200, 3, 64, 96, torch.float32, seed=0)
        grad_weight(grad_out, x, supports, 64, pack=pack)


def test_grad_weight_packs_two_groups_by_default_where_measured():
    """Two groups a dot by default at F <= 32, G <= 32 in 16-bit dtypes (triton_backward_sweep_h200_d1ec341.txt:
    0.62 against 1.13 of CUDA's time at B = 512, F = 32, G = 16), one elsewhere (unmeasured, or more shared memory
    than a Turing GPU has); the fp16 cases of test_grad_weight_matches_reference run the packed default."""
    from haste_hf.kernels.triton.grad_weight import launch_defaults

    for batch, group, fan_in, dtype in [
        (512, 16, 32, torch.bfloat16),
        (64, 32, 32, torch.float16),
        (8, 3, 7, torch.half),
    ]:
        assert launch_defaults(batch, 1000, group, fan_in, dtype)["pack"] == 2
    for batch, group, fan_in, dtype in [(512, 16, 64, torch.bfloat16), (64, 64, 32, torch.bfloat16)]:
        assert launch_defaults(batch, 1000, group, fan_in, dtype)["pack"] == 1
    assert launch_defaults(512, 1000, 16, 32, torch.float32)["pack"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32] if GPU else [torch.float32], ids=str)
def test_deterministic_grad_input_is_bitwise_reproducible(kernels, dtype):
    """Runs of groups that share features (d small against K * F) in one program: each group's update
    must see the previous one's, in the same order every run."""
    _, grad_input = kernels
    shape = (96, 768, 600, 32, 64) if GPU else (40, 64, 24, 16, 32)
    x, weight, supports, grad_out = make_operands(*shape, dtype, seed=3)
    runs = [grad_input(grad_out, weight, supports, shape[1], True) for _ in range(3)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    expected, _ = reference_gradients(x, weight, supports, grad_out)
    check("grad_x", runs[0], expected, dtype)


@gpu
@pytest.mark.gpu
def test_64_bit_offsets(kernels):
    """B * K * G above 2**31: the last rows and groups are right in both gradients."""
    grad_weight, grad_input = kernels
    batch, group_size, fan_in = 264, 32, 32
    groups = (1 << 31) // (batch * group_size) + 8
    x, weight, supports, _ = make_operands(batch, 768, groups, group_size, fan_in, torch.bfloat16, seed=7)
    grad_out = torch.randn(batch, groups * group_size, device="cuda", dtype=torch.bfloat16)
    assert grad_out.numel() > 2**31
    tail = slice(groups - 4, groups)
    actual = grad_weight(grad_out, x, supports, group_size)[tail]
    expected = torch.einsum(
        "bkg,bkf->kgf",
        grad_out[:, -4 * group_size :].double().view(batch, 4, group_size),
        x[:, supports[tail].long()].double(),
    )
    check("grad_weight", actual, expected, torch.bfloat16)
    x32 = x.float().requires_grad_()
    sparse_ops._GroupSparseLinearFunction.apply(x32, weight.float(), supports).backward(grad_out.float())
    for deterministic in (False, True):
        check("grad_x", grad_input(grad_out, weight, supports, 768, deterministic), x32.grad, torch.bfloat16)


def test_operands_are_checked(kernels):
    grad_weight, grad_input = kernels
    x, weight, supports, grad_out = make_operands(8, 64, 4, 16, 32, torch.float32, seed=0)
    with pytest.raises(ValueError, match="int32 `supports`"):
        grad_weight(grad_out, x, supports.long(), 16)
    with pytest.raises(ValueError, match="`grad_out` must be"):
        grad_weight(grad_out[:, :-16], x, supports, 16)
    with pytest.raises(ValueError, match="contiguous `weight`"):
        grad_input(grad_out, weight.transpose(1, 2).contiguous().transpose(1, 2), supports, 64, False)
    with pytest.raises(ValueError, match="`grad_out` must be"):
        grad_input(grad_out.half(), weight, supports, 64, True)
    with pytest.raises(ValueError, match="at most 65535"):
        many = torch.zeros(70_000, 16, 1, device=DEVICE)  # checked before any launch: never read
        grad_input(many.new_zeros(1, 70_000 * 16), many, supports[:1, :1].repeat(70_000, 1), 64, False, 32, 1, pack=1)


def test_interpreter_is_what_runs_on_cpu(kernels):
    """On a CPU the fixture must have swapped in interpreted kernels (and on a GPU, compiled ones)."""
    module = importlib.import_module(MODULES[1])
    interpreted = type(module._grad_input_kernel).__name__ == "InterpretedFunction"
    assert interpreted == (not GPU), type(module._grad_input_kernel)
