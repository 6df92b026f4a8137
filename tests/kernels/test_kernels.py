# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Tests of the custom ops (haste_hf.kernels.ops) on each backend (Triton, the CUDA build) against the PyTorch path
of haste_hf.modeling.sparse_ops.

The GPU tests compile the kernels on first use; CI has no GPU and runs here only the validation, fake
implementation and fallback tests (the Triton kernels themselves run there through Triton's interpreter:
tests/kernels/triton/).
"""

import itertools
import warnings

import pytest
import torch
from kernel_operands import GPU_SHAPES, TOLERANCE, make_layer, relative_error

from haste_hf.kernels import ops as kernels
from haste_hf.modeling import sparse_ops


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reference(x, weight, supports, bias, grad_out):
    """Outputs and gradients of the PyTorch path in float64."""
    x64 = x.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    b64 = bias.detach().double().requires_grad_() if bias is not None else None
    out = sparse_ops._GroupSparseLinearFunction.apply(x64, w64, supports.long())
    if b64 is not None:
        out = out + b64
    out.backward(grad_out.double())
    return out.detach(), x64.grad, w64.grad, None if b64 is None else b64.grad


def poison_allocator(*shapes, dtype):
    """Leaves NaN in the caching allocator's free blocks of these sizes, so that outputs the kernels
    allocate start out as NaN and an unwritten element shows up."""
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape in shapes]
    del blocks


# ------------------------------------------------------------------------------------------------
# CPU: validation, fake implementations, build fallback
# ------------------------------------------------------------------------------------------------
class TestValidation:
    def valid(self):
        return make_layer(4, 16, 3, 8, 5, torch.float32, "cpu", 0, bias=False)

    def test_cpu_tensors_are_rejected_last(self):
        x, weight, supports, _ = self.valid()
        with pytest.raises(ValueError, match="CUDA tensors"):
            kernels.validate_inputs(x, weight, supports, check_indices=True)

    def test_dtype(self):
        x, weight, supports, _ = self.valid()
        with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
            kernels.validate_inputs(x.double(), weight.double(), supports)
        with pytest.raises(ValueError, match="dtype of `x`"):
            kernels.validate_inputs(x, weight.half(), supports)
        with pytest.raises(ValueError, match="int32"):
            kernels.validate_inputs(x, weight, supports.long())

    def test_shapes(self):
        x, weight, supports, _ = self.valid()
        with pytest.raises(ValueError, match=r"\[K, F\]"):
            kernels.validate_inputs(x, weight, supports[:, :4])
        with pytest.raises(ValueError, match="bias"):
            kernels.validate_inputs(x, weight, supports, torch.zeros(5))

    def test_contiguity(self):
        x, weight, supports, _ = self.valid()
        with pytest.raises(ValueError, match="`weight` must be contiguous"):
            kernels.validate_inputs(x, weight.transpose(0, 1).contiguous().transpose(0, 1), supports)

    def test_index_range_and_duplicates(self):
        x, weight, supports, _ = self.valid()
        bad = supports.clone()
        bad[1, 2] = 16
        with pytest.raises(ValueError, match="outside"):
            kernels.validate_inputs(x, weight, bad, check_indices=True)
        bad = supports.clone()
        bad[2, 4] = bad[2, 0]
        with pytest.raises(ValueError, match="repeats a feature within group 2"):
            kernels.validate_inputs(x, weight, bad, check_indices=True)

    @pytest.mark.parametrize("valid_count", [-1, 25])
    def test_loss_valid_count(self, valid_count):
        """`linear_loss` checks `valid_count` against the layer's outputs for both backends, before any kernel."""
        x = torch.randn(4, 16)
        weight = torch.randn(24, 16)
        positions = torch.zeros(4, 2, dtype=torch.int64)
        with pytest.raises(ValueError, match=r"`valid_count` must lie in \[0, 24\]"):
            kernels.linear_loss(x, weight, None, None, positions, valid_count, 1.0)


@pytest.mark.parametrize("backend_name", kernels.BACKENDS)
def test_fast_path_envelope_is_computed_from_shapes(monkeypatch, backend_name):
    monkeypatch.setattr(kernels, "_backend", backend_name)
    monkeypatch.setattr(kernels, "_shared_memory_optin", 227 * 1024)
    monkeypatch.setattr(kernels, "_bf16_tensor_cores", True)
    x = torch.empty(4, 768, dtype=torch.bfloat16)
    assert kernels.has_fast_path(x, torch.empty(3, 32, 64, dtype=torch.bfloat16))
    assert kernels.has_fast_path(x.half(), torch.empty(3, 48, 96, dtype=torch.float16))
    assert not kernels.has_fast_path(x.float(), torch.empty(3, 32, 64))
    assert not kernels.has_fast_path(x, torch.empty(3, 24, 64, dtype=torch.bfloat16))
    assert not kernels.has_fast_path(x, torch.empty(3, 32, 48, dtype=torch.bfloat16))
    # The CUDA build: d = 1614 is the widest feature tile that fits 227 KiB (1614 * 72 * 2 bytes); one more does
    # not. Triton gathers from global memory: no bound on d.
    weight = torch.empty(3, 32, 64, dtype=torch.bfloat16)
    assert kernels.has_fast_path(torch.empty(4, 1614, dtype=torch.bfloat16), weight)
    assert kernels.has_fast_path(torch.empty(4, 1615, dtype=torch.bfloat16), weight) == (backend_name == "triton")
    # Triton on a GPU without bf16 tensor cores (compute capability 7.5): fp16 only.
    monkeypatch.setattr(kernels, "_bf16_tensor_cores", False)
    assert kernels.has_fast_path(x.half(), torch.empty(3, 32, 64, dtype=torch.float16))
    assert kernels.has_fast_path(x, weight) == (backend_name == "cuda")


def test_backend_is_chosen_by_name(monkeypatch):
    monkeypatch.setattr(kernels, "_backend", kernels.backend())
    with pytest.raises(ValueError, match="must be one of"):
        kernels.set_backend("cutlass")
    monkeypatch.setenv("HASTE_HF_KERNELS", "nvcc")
    with pytest.raises(ValueError, match="HASTE_HF_KERNELS"):
        kernels._backend_from_environment()
    monkeypatch.delenv("HASTE_HF_KERNELS")
    assert kernels._backend_from_environment() == "triton"


def test_cuda_build_says_once_that_it_builds(monkeypatch, tmp_path, capsys):
    """The CUDA build's first use prints one line (it takes about a minute); a cached build prints nothing."""
    import torch.utils.cpp_extension

    def build(name, build_directory, **kwargs):
        (tmp_path / "haste_hf_kernels.so").touch()
        return "extension"

    monkeypatch.setattr(torch.utils.cpp_extension, "load", build)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(kernels, "_build_directory", lambda sources: tmp_path)
    for expected_lines in (1, 0):
        monkeypatch.setattr(kernels, "_extension", None)
        monkeypatch.setattr(kernels, "_build_failed", False)
        assert kernels._load_extension() == "extension"
        lines = [line for line in capsys.readouterr().err.splitlines() if "building the CUDA kernels" in line]
        assert len(lines) == expected_lines


def test_missing_triton_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(kernels, "_triton", None)
    monkeypatch.setattr(kernels, "_triton_failed", False)
    monkeypatch.setattr(kernels, "_TRITON_MODULES", ("no_such_kernel",))
    with pytest.warns(RuntimeWarning, match="Triton kernels could not be loaded"):
        assert kernels._load_triton() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels._load_triton() is None


def test_fake_implementations_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 7, dtype=torch.bfloat16)
        weight = torch.empty(3, 4, 2, dtype=torch.bfloat16)
        supports = torch.empty(3, 2, dtype=torch.int32)
        grad_out = torch.empty(5, 12, dtype=torch.bfloat16)
        assert torch.ops.haste.group_sparse_forward(x, weight, supports, None, False).shape == (5, 12)
        assert torch.ops.haste.group_sparse_grad_weight(grad_out, x, supports, 4).shape == (3, 4, 2)
        assert torch.ops.haste.group_sparse_grad_input(grad_out, weight, supports, 7, True).shape == (5, 7)


def test_failed_build_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(kernels, "_extension", None)
    monkeypatch.setattr(kernels, "_build_failed", False)

    def missing_sources():
        raise FileNotFoundError("no sources here")

    monkeypatch.setattr(kernels, "_source_dir", missing_sources)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        assert kernels._load_extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels._load_extension() is None


# ------------------------------------------------------------------------------------------------
# GPU: kernels against the reference
# ------------------------------------------------------------------------------------------------
# `GPU_SHAPES`, then a wide d and a G and F that are neither powers of two nor tensor-core sizes.
SHAPES = [*GPU_SHAPES, (97, 1400, 11, 16, 128), (40, 96, 6, 20, 33)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-d{}-K{}-G{}-F{}".format(*s))
def test_matches_reference(shape, dtype, deterministic, backend):
    assert kernels.is_available()
    batch, features, groups, group_size, fan_in = shape
    x, weight, supports, bias = make_layer(*shape, dtype, "cuda", sum(shape))
    x.requires_grad_()
    weight.requires_grad_()
    bias.requires_grad_()
    grad_out = torch.randn(batch, groups * group_size, device="cuda").to(dtype)
    poison_allocator((batch, groups * group_size), (groups, group_size, fan_in), (batch, features), dtype=dtype)
    out = kernels.group_sparse_linear(x, weight, supports, bias, deterministic=deterministic)
    out.backward(grad_out)
    expected = reference(x, weight, supports, bias, grad_out)
    for name, actual, wanted in zip(
        ("out", "grad_x", "grad_weight", "grad_bias"), (out, x.grad, weight.grad, bias.grad), expected
    ):
        assert torch.isfinite(actual).all(), f"{name} has unwritten (NaN) or non-finite elements"
        error = relative_error(actual, wanted)
        assert error < TOLERANCE[dtype], f"{name}: relative error {error:.2e}"


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_deterministic_feature_gradient_is_bitwise_reproducible(dtype, backend):
    x, weight, supports, _ = make_layer(96, 768, 600, 32, 64, dtype, "cuda", 3, bias=False)
    grad_out = torch.randn(96, 600 * 32, device="cuda").to(dtype)
    runs = [torch.ops.haste.group_sparse_grad_input(grad_out, weight, supports, 768, True) for _ in range(3)]
    assert all(torch.equal(runs[0], run) for run in runs[1:])
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x.requires_grad_()
        kernels.group_sparse_linear(x, weight, supports).backward(grad_out)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert torch.equal(x.grad, runs[0])


@gpu
@pytest.mark.gpu
def test_fast_path_envelope(monkeypatch):
    """The CUDA build's two kernel families (Triton has one, for every shape)."""
    monkeypatch.setattr(kernels, "_backend", "cuda")
    x, weight, _, _ = make_layer(8, 768, 2, 32, 64, torch.bfloat16, "cuda", 0, bias=False)
    kernels.is_available()
    assert set(kernels.kernel_paths(x, weight).values()) == {"tensor_core"}
    assert set(kernels.kernel_paths(x.float(), weight.float()).values()) == {"generic"}
    assert kernels.kernel_paths(x, weight[:, :24])["forward"] == "generic"
    # A feature tile too large for shared memory falls back to the generic kernels.
    wide = torch.empty(8, 200_000, dtype=torch.bfloat16, device="cuda")
    assert kernels.kernel_paths(wide, weight) == {
        "forward": "generic",
        "grad_weight": "tensor_core",
        "grad_input": "generic",
    }
    # The Python envelope used for dispatch agrees with the one the launcher computes.
    for features, group_size, fan_in in itertools.product((768, 1200, 1614, 1615, 4000), (16, 48), (64, 256, 512)):
        probe = torch.empty(8, features, dtype=torch.bfloat16, device="cuda")
        probe_weight = torch.empty(2, group_size, fan_in, dtype=torch.bfloat16, device="cuda")
        all_tensor_core = set(kernels.kernel_paths(probe, probe_weight).values()) == {"tensor_core"}
        assert kernels.has_fast_path(probe, probe_weight) == all_tensor_core


@gpu
@pytest.mark.gpu
def test_dispatch_and_torch_compile_without_graph_breaks(backend):
    x, weight, supports, bias = make_layer(64, 256, 20, 32, 32, torch.bfloat16, "cuda", 5)
    grad_out = torch.randn(64, 640, device="cuda").to(torch.bfloat16)

    def step(x, weight, bias):
        return (sparse_ops.group_sparse_linear(x, weight, supports, bias) * grad_out).float().sum()

    grads = []
    for fn in (step, torch.compile(step, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
        fn(*leaves).backward()
        grads.append([leaf.grad for leaf in leaves])
    for eager, compiled in zip(*grads):
        assert relative_error(compiled, eager) < 1e-2
    # The kernels ran (not the PyTorch path): the compiled graph holds the custom op.
    explanation = torch._dynamo.explain(step)(x, weight, bias)
    assert explanation.graph_break_count == 0


@gpu
@pytest.mark.gpu
def test_64_bit_offsets(backend):
    """B * K * G above 2**31: the last rows and labels are right."""
    batch, groups, group_size, fan_in = 264, (1 << 31) // (264 * 32) + 8, 32, 32
    x, weight, supports, _ = make_layer(batch, 768, groups, group_size, fan_in, torch.bfloat16, "cuda", 7, bias=False)
    out = torch.ops.haste.group_sparse_forward(x, weight, supports, None, False)
    assert out.numel() > 2**31
    tail = slice(groups - 4, groups)
    expected = sparse_ops._forward_reference(x[-3:].float(), weight[tail].float(), supports[tail].long())
    assert relative_error(out[-3:, -4 * group_size :], expected) < TOLERANCE[torch.bfloat16]
    grad_out = torch.randn_like(out)
    del out
    grad_weight = torch.ops.haste.group_sparse_grad_weight(grad_out, x, supports, group_size)
    expected = torch.einsum(
        "bkg,bkf->kgf",
        grad_out[:, -4 * group_size :].float().view(batch, 4, group_size),
        x[:, supports[tail].long()].float(),
    )
    assert relative_error(grad_weight[tail], expected) < TOLERANCE[torch.bfloat16]
    grad_x = torch.ops.haste.group_sparse_grad_input(grad_out, weight, supports, 768, False)
    x32 = x.float().requires_grad_()
    sparse_ops._GroupSparseLinearFunction.apply(x32, weight.float(), supports).backward(grad_out.float())
    assert relative_error(grad_x, x32.grad) < TOLERANCE[torch.bfloat16]
