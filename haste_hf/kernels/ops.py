# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The group-shared sparse tail's kernels as `torch.library` custom ops, served by Triton or by a JIT CUDA build.

The three passes are `torch.library` custom ops (`haste::group_sparse_forward`, `haste::group_sparse_grad_weight`,
`haste::group_sparse_grad_input`), with the fused loss `haste::linear_loss` and the fused top-k
`haste::group_sparse_topk`, each with a fake implementation and autograd, so `torch.compile` and `torch.export`
trace through them without graph breaks.

Two backends compute them, chosen by `$HASTE_HF_KERNELS` (or `set_backend`):
- `triton` (default): the kernels of `haste_hf.kernels.triton`, compiled by Triton on first use (it ships with
  torch's CUDA wheels: nothing beyond `pip install`) and cached on disk by Triton (`~/.triton/cache`);
- `cuda`: the CUDA C++ sources (`csrc/`, shipped as `haste_hf._csrc`), built by `torch.utils.cpp_extension.load`
  with nvcc and ninja the first time a CUDA tensor needs them, into a cache folder keyed by the torch version, the
  CUDA version and the GPU architecture (`$HASTE_HF_KERNEL_CACHE`, default `~/.cache/haste_hf/kernels`).
If the chosen backend cannot run (no Triton, a failed build), one warning is raised and
`haste_hf.modeling.sparse_ops` keeps using its PyTorch path.

bf16 and fp16 run on tensor cores (fp32 accumulation) when `G % 16 == 0` and `F % 32 == 0` (and, for the CUDA
build, the feature tile fits the GPU's shared memory): `has_fast_path`. `haste_hf.modeling.sparse_ops` sends only
those operands here; direct callers may pass any shape and fp32 (true fp32 products, no TF32), correct but not
fast. The feature gradient sums over label groups with floating-point atomics unless determinism is asked for
(`torch.use_deterministic_algorithms(True)` or `deterministic=True`): then partial sums are added in a fixed order.

Set `HASTE_HF_VALIDATE=1` (or `haste_hf.kernels.ops.VALIDATE = True`) to also check, at the cost of a
device synchronization per call, that every support is in range and free of duplicates.
"""

import hashlib
import importlib
import importlib.util
import os
import sys
import types
import warnings
from pathlib import Path

import torch


VALIDATE = os.environ.get("HASTE_HF_VALIDATE", "0") == "1"
BACKENDS = ("triton", "cuda")

_SOURCES = ("binding.cpp", "group_sparse.cu", "group_sparse_kernels.cuh")
_SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_extension = None
_build_failed = False
_TRITON_MODULES = ("forward", "grad_weight", "grad_input", "loss", "topk")
_triton = None
_triton_failed = False


def _backend_from_environment() -> str:
    name = os.environ.get("HASTE_HF_KERNELS", "triton")
    if name not in BACKENDS:
        raise ValueError(f"$HASTE_HF_KERNELS must be one of {BACKENDS}, got {name!r}; unset it for Triton.")
    return name


_backend = _backend_from_environment()


def backend() -> str:
    """The backend that serves the ops: "triton" or "cuda"."""
    return _backend


def set_backend(name: str) -> None:
    """Serves the ops from `name` ("triton" or "cuda") from now on (the benchmarks time both in one process)."""
    global _backend
    if name not in BACKENDS:
        raise ValueError(f"`name` must be one of {BACKENDS}, got {name!r}.")
    _backend = name


def _load_triton():
    """The Triton kernels' modules (imported on first use), or None with one warning when Triton is missing."""
    global _triton, _triton_failed
    if _triton is not None or _triton_failed:
        return _triton
    try:
        _triton = types.SimpleNamespace(
            **{name: importlib.import_module(f"haste_hf.kernels.triton.{name}") for name in _TRITON_MODULES}
        )
    except Exception as error:  # no Triton, or one that cannot load: fall back, say so once
        _triton_failed = True
        warnings.warn(
            f"haste_hf: the Triton kernels could not be loaded ({type(error).__name__}: {error}); the sparse tail uses "
            "its slower PyTorch path. Triton ships with torch's CUDA wheels (`pip install triton` otherwise).",
            RuntimeWarning,
            stacklevel=3,
        )
    return _triton


def _source_dir() -> Path:
    """`csrc/` of a source checkout, or its installed copy `haste_hf._csrc`."""
    checkout = Path(__file__).resolve().parents[2] / "csrc"
    if (checkout / "group_sparse.cu").is_file():
        return checkout
    spec = importlib.util.find_spec("haste_hf._csrc")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the CUDA sources of haste_hf (package `haste_hf._csrc`) are not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _build_directory(sources: Path) -> Path:
    major, minor = torch.cuda.get_device_capability()
    digest = hashlib.sha256(b"".join((sources / name).read_bytes() for name in _SOURCES)).hexdigest()[:12]
    key = f"torch{torch.__version__}-cuda{torch.version.cuda}-sm{major}{minor}-{digest}".replace("+", "_")
    root = Path(os.environ.get("HASTE_HF_KERNEL_CACHE", Path.home() / ".cache" / "haste_hf" / "kernels"))
    path = root / key
    path.mkdir(parents=True, exist_ok=True)
    return path


def _load_extension():
    global _extension, _build_failed
    if _extension is not None or _build_failed:
        return _extension
    try:
        from torch.utils.cpp_extension import load

        sources = _source_dir()
        major, minor = torch.cuda.get_device_capability()
        build_directory = _build_directory(sources)
        if not (build_directory / "haste_hf_kernels.so").is_file():
            print(f"haste_hf: building the CUDA kernels into {build_directory} (once, about a minute)", file=sys.stderr)
        # Only this GPU's architecture: one compile pass, and the cache key above names it.
        previous_arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        try:
            _extension = load(
                name="haste_hf_kernels",
                sources=[str(sources / "binding.cpp"), str(sources / "group_sparse.cu")],
                extra_include_paths=[str(sources)],
                extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo"],
                build_directory=str(build_directory),
                verbose=os.environ.get("HASTE_HF_KERNEL_VERBOSE", "0") == "1",
            )
        finally:
            if previous_arch_list is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = previous_arch_list
    except Exception as error:  # any build or load failure: fall back, say so once
        _build_failed = True
        warnings.warn(
            f"haste_hf: the CUDA kernels could not be built ({type(error).__name__}: {error}); the sparse tail "
            "uses its slower PyTorch path. Set HASTE_HF_KERNEL_VERBOSE=1 to see the compiler output.",
            RuntimeWarning,
            stacklevel=3,
        )
    return _extension


# Shared memory a block may opt in to on this GPU, read once by `is_available` (the CUDA build's envelope).
_shared_memory_optin = 0
# Whether this GPU multiplies bf16 on tensor cores (compute capability >= 8.0), read once by `is_available`.
_bf16_tensor_cores = False


@torch.compiler.assume_constant_result
def is_available() -> bool:
    """True when a CUDA GPU is present and the chosen backend can serve it (Triton importable, compute capability
    >= 7.5; or the CUDA build, compute capability >= 8.0, built on the first call)."""
    global _shared_memory_optin, _bf16_tensor_cores
    if not torch.cuda.is_available():
        return False
    capability = torch.cuda.get_device_capability()
    _bf16_tensor_cores = capability >= (8, 0)
    if _backend == "triton":
        return capability >= (7, 5) and _load_triton() is not None
    if capability < (8, 0):
        return False
    if not _shared_memory_optin:
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        _shared_memory_optin = getattr(properties, "shared_memory_per_block_optin", 227 * 1024)
    return _load_extension() is not None


def has_fast_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """True when all three passes run on tensor cores for these operands: bf16 (on a GPU with bf16 tensor cores)
    or fp16, `G % 16 == 0`, `F % 32 == 0`; for the CUDA build also the forward's feature tile `[d, 64 + 8]` (16-bit)
    and the feature gradient's fp32 accumulator `[d, 32 + 4]` within the shared memory a block may opt in to
    (d <= 1614 on a Hopper GPU). Pure Python on shapes, so `torch.compile` traces it. Call `is_available()` first."""
    num_features = x.shape[1]
    _, group_size, fan_in = weight.shape
    tensor_core_shape = (
        (x.dtype == torch.float16 or (x.dtype == torch.bfloat16 and (_bf16_tensor_cores or _backend == "cuda")))
        and group_size % 16 == 0
        and fan_in % 32 == 0
    )
    if _backend == "triton":
        return tensor_core_shape
    return (
        tensor_core_shape
        and num_features * (64 + 8) * 2 <= _shared_memory_optin
        and num_features * (32 + 4) * 4 <= _shared_memory_optin
    )


def kernel_paths(x: torch.Tensor, weight: torch.Tensor) -> dict:
    """Kernel family that each pass uses for these operands: "tensor_core" or "generic" (the CUDA build's two
    families), or "triton" (one family for every shape)."""
    if _backend == "triton":
        return dict.fromkeys(("forward", "grad_weight", "grad_input"), "triton")
    forward, grad_weight, grad_input = _load_extension().kernel_paths(x, weight)
    return {"forward": forward, "grad_weight": grad_weight, "grad_input": grad_input}


def validate_inputs(
    x: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    bias: torch.Tensor | None = None,
    check_indices: bool = False,
) -> None:
    """Raises a ValueError naming the argument and the fix when the kernels cannot take these operands.

    `check_indices` also checks that every support lies in `[0, d)` and has no repeated feature
    (this reads the supports back to the host).
    """
    if x.dim() != 2 or weight.dim() != 3 or supports.dim() != 2:
        raise ValueError(
            f"expected x [B, d], weight [K, G, F] and supports [K, F]; got x {tuple(x.shape)}, weight "
            f"{tuple(weight.shape)}, supports {tuple(supports.shape)}."
        )
    num_groups, group_size, fan_in = weight.shape
    if tuple(supports.shape) != (num_groups, fan_in):
        raise ValueError(f"`supports` must be [K, F] = {(num_groups, fan_in)}, got {tuple(supports.shape)}.")
    if x.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"`x` must be bfloat16, float16 or float32, got {x.dtype}.")
    if weight.dtype != x.dtype:
        raise ValueError(f"`weight` ({weight.dtype}) must have the dtype of `x` ({x.dtype}); cast one of them.")
    if supports.dtype != torch.int32:
        raise ValueError(f"`supports` must be int32, got {supports.dtype}; use `supports.int()`.")
    if bias is not None and (tuple(bias.shape) != (num_groups * group_size,) or bias.dtype != x.dtype):
        raise ValueError(
            f"`bias` must be a {x.dtype} vector of length K * G = {num_groups * group_size}, got {bias.dtype} "
            f"{tuple(bias.shape)}."
        )
    for name, tensor in (("weight", weight), ("supports", supports)):
        if not tensor.is_contiguous():
            raise ValueError(f"`{name}` must be contiguous; call `.contiguous()` on it (once, not per step).")
    devices = {x.device, weight.device, supports.device} | ({bias.device} if bias is not None else set())
    if len(devices) != 1:
        raise ValueError(
            f"`x`, `weight`, `supports` and `bias` must be on one device, got {sorted(map(str, devices))}."
        )
    if check_indices and supports.numel() > 0:
        low, high = int(supports.min()), int(supports.max())
        if low < 0 or high >= x.shape[1]:
            raise ValueError(f"`supports` holds feature indices in [{low}, {high}], outside [0, d = {x.shape[1]}).")
        ordered = supports.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1).nonzero()
        if repeated.numel() > 0:
            raise ValueError(
                f"`supports` repeats a feature within group {int(repeated[0, 0])} (and {repeated.numel() - 1} other "
                "groups); each group's F features must be distinct."
            )
    if x.device.type != "cuda":
        raise ValueError(
            f"the CUDA kernels need CUDA tensors, got {x.device}; use `haste_hf.modeling.sparse_ops` on CPU."
        )


# ------------------------------------------------------------------------------------------------
# Custom ops. The real implementations call the compiled extension; the fake ones give shapes only.
# ------------------------------------------------------------------------------------------------
@torch.library.custom_op("haste::group_sparse_forward", mutates_args=(), device_types="cuda")
def _forward_op(
    x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, bias: torch.Tensor | None, deterministic: bool
) -> torch.Tensor:
    # `deterministic` only travels to the backward, which reads it from the saved context.
    if _backend == "triton":
        return _load_triton().forward.forward(x, weight, supports, bias)
    return _load_extension().forward(x, weight, supports, bias)


@_forward_op.register_fake
def _(x, weight, supports, bias, deterministic):
    return x.new_empty(x.shape[0], weight.shape[0] * weight.shape[1])


@torch.library.custom_op("haste::group_sparse_grad_weight", mutates_args=(), device_types="cuda")
def _grad_weight_op(grad_out: torch.Tensor, x: torch.Tensor, supports: torch.Tensor, group_size: int) -> torch.Tensor:
    if _backend == "triton":
        return _load_triton().grad_weight.grad_weight(grad_out, x, supports, group_size)
    return _load_extension().grad_weight(grad_out, x, supports, group_size)


@_grad_weight_op.register_fake
def _(grad_out, x, supports, group_size):
    return x.new_empty(supports.shape[0], group_size, supports.shape[1])


@torch.library.custom_op("haste::group_sparse_grad_input", mutates_args=(), device_types="cuda")
def _grad_input_op(
    grad_out: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, num_features: int, deterministic: bool
) -> torch.Tensor:
    if _backend == "triton":
        return _load_triton().grad_input.grad_input(grad_out, weight, supports, num_features, deterministic)
    return _load_extension().grad_input(grad_out, weight, supports, num_features, deterministic)


@_grad_input_op.register_fake
def _(grad_out, weight, supports, num_features, deterministic):
    return grad_out.new_empty(grad_out.shape[0], num_features)


def _setup_context(ctx, inputs, output):
    x, weight, supports, bias, deterministic = inputs
    ctx.save_for_backward(x, weight, supports)
    ctx.deterministic = deterministic


def _backward(ctx, grad_out):
    x, weight, supports = ctx.saved_tensors
    grad_out = grad_out.contiguous()
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = _grad_input_op(grad_out, weight, supports, x.shape[1], ctx.deterministic)
    if ctx.needs_input_grad[1]:
        grad_weight = _grad_weight_op(grad_out, x, supports, weight.shape[1])
    if ctx.needs_input_grad[3]:
        grad_bias = grad_out.sum(0)
    return grad_x, grad_weight, None, grad_bias, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


# ------------------------------------------------------------------------------------------------
# The fused loss of an output layer (haste_hf.modeling.losses) and the fused top-k of the tail.
# ------------------------------------------------------------------------------------------------
_LOSS_KINDS = {"bce": 0, "squared_hinge": 1}


@torch.library.custom_op("haste::linear_loss", mutates_args=(), device_types="cuda")
def _linear_loss_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    supports: torch.Tensor | None,
    positions: torch.Tensor,
    valid_count: int,
    scale: float,
    loss: str,
    store_gradient: bool,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # `deterministic` only travels to the backward, which reads it from the saved context.
    if _backend == "triton":
        return _load_triton().loss.linear_loss(
            x, weight, bias, supports, positions, valid_count, scale, loss, store_gradient
        )
    loss_value, grad_logits = _load_extension().linear_loss(
        x, weight, bias, supports, positions, valid_count, scale, _LOSS_KINDS[loss], store_gradient
    )
    return loss_value, grad_logits


@_linear_loss_op.register_fake
def _(x, weight, bias, supports, positions, valid_count, scale, loss, store_gradient, deterministic):
    outputs = weight.shape[0] * weight.shape[1] if supports is not None else weight.shape[0]
    return x.new_empty((), dtype=torch.float32), x.new_empty(x.shape[0] if store_gradient else 0, outputs)


def _linear_loss_setup_context(ctx, inputs, output):
    x, weight, bias, supports, *_, deterministic = inputs
    ctx.save_for_backward(x, weight, supports, output[1])
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.deterministic = deterministic


def _linear_loss_backward(ctx, grad_loss, _grad_of_gradient):
    x, weight, supports, grad_logits = ctx.saved_tensors
    if grad_logits.shape[0] != x.shape[0]:
        raise RuntimeError("haste::linear_loss ran without storing its logit gradient (store_gradient=False).")
    # The stored gradient already holds the loss's scale; the upstream factor (1 for `loss.backward()`)
    # scales the small operand of each product, `x` or the `[B, d]` result, never a `[B, n]` or weight-sized
    # tensor (a pass over the weight gradient would cost its bytes twice and a copy of it in memory).
    grad_x = grad_weight = grad_bias = None
    if supports is None:
        if ctx.needs_input_grad[0]:
            grad_x = torch.mul(grad_logits @ weight, grad_loss)
        if ctx.needs_input_grad[1]:
            grad_weight = grad_logits.t() @ torch.mul(x, grad_loss)
    else:
        if ctx.needs_input_grad[0]:
            grad_x = torch.mul(_grad_input_op(grad_logits, weight, supports, x.shape[1], ctx.deterministic), grad_loss)
        if ctx.needs_input_grad[1]:
            grad_weight = _grad_weight_op(grad_logits, torch.mul(x, grad_loss), supports, weight.shape[1])
    if ctx.needs_input_grad[2]:
        grad_bias = (grad_logits.sum(0, dtype=torch.float32) * grad_loss).to(ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias, None, None, None, None, None, None, None


_linear_loss_op.register_autograd(_linear_loss_backward, setup_context=_linear_loss_setup_context)


def fuses_loss(x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor | None) -> bool:
    """True when `linear_loss` serves this layer: a dense one (cuBLAS + one fused kernel, bf16 / fp16 / fp32)
    or a group-sparse one on the tensor-core path (`has_fast_path`). Call `is_available()` first."""
    if x.dtype not in _SUPPORTED_DTYPES or weight.dtype != x.dtype:
        return False
    return supports is None or has_fast_path(x, weight)


def _check_loss_inputs(x, weight, bias, supports, loss: str) -> None:
    """Raises a `ValueError` naming what `linear_loss`'s layer gets wrong: the loss, or the shapes and dtypes."""
    if loss not in _LOSS_KINDS:
        raise ValueError(f"`loss` must be one of {sorted(_LOSS_KINDS)}, got {loss!r}.")
    if supports is not None:
        validate_inputs(x, weight, supports, bias, check_indices=VALIDATE)
    elif x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.dtype != x.dtype:
        raise ValueError(
            f"a dense layer needs x [B, d] and weight [n, d] of one dtype; got x {tuple(x.shape)} {x.dtype}, "
            f"weight {tuple(weight.shape)} {weight.dtype}."
        )


def linear_loss(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    supports: torch.Tensor | None,
    positions: torch.Tensor,
    valid_count: int,
    scale: float,
    loss: str = "bce",
    deterministic: bool | None = None,
) -> torch.Tensor:
    """`scale` times the loss of a dense (`[n, d]`) or group-sparse (`[K, G, F]` + int32 `supports`) layer
    over its outputs `[0, valid_count)`, differentiable in `x`, `weight` and `bias` (see
    `haste_hf.modeling.losses.output_layer_loss`, which dispatches here). The forward stores the logit gradient
    `scale * dloss/dz` in the layer's dtype `[B, n]` for the backward, and no logits at all for a sparse
    layer on the tensor-core path; without autograd it stores nothing. Loss sums are reproducible."""
    _check_loss_inputs(x, weight, bias, supports, loss)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    tracked = [x, weight] + ([bias] if bias is not None else [])
    store_gradient = torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tracked)
    with torch.autocast("cuda", enabled=False):  # the logits and their gradient in the layer's dtype
        loss_value, _ = _linear_loss_op(
            x.contiguous(),
            weight.contiguous(),
            bias,
            supports,
            positions,
            valid_count,
            float(scale),
            loss,
            store_gradient,
            deterministic,
        )
    return loss_value


def linear_loss_gradient(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    supports: torch.Tensor | None,
    positions: torch.Tensor,
    valid_count: int,
    scale: float,
    loss: str = "bce",
) -> torch.Tensor:
    """The logit gradient `scale * dloss/dz` `[B, n]` of `linear_loss`'s layer, in its dtype (0 at outputs
    `>= valid_count`), as the fused op's forward writes it for its backward; not differentiable. A slice of
    a layer (contiguous rows or groups) with positions relative to its first column gives that slice's
    gradient: `haste_hf.modeling.losses` recomputes the gradient chunk by chunk this way."""
    _check_loss_inputs(x, weight, bias, supports, loss)
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        _, grad_logits = _linear_loss_op(
            x.contiguous(), weight.contiguous(), bias, supports, positions, valid_count, float(scale), loss, True, False
        )
    return grad_logits


def group_sparse_grad_weight(
    grad_out: torch.Tensor, x: torch.Tensor, supports: torch.Tensor, group_size: int
) -> torch.Tensor:
    """The weight gradient `[K, G, F]` of `group_sparse_linear` from its output gradient `[B, K * G]`; not
    differentiable."""
    return _grad_weight_op(grad_out.contiguous(), x.contiguous(), supports, group_size)


def group_sparse_grad_input(
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    num_features: int,
    deterministic: bool | None = None,
) -> torch.Tensor:
    """The feature gradient `[B, num_features]` of `group_sparse_linear` from its output gradient `[B, K * G]`;
    not differentiable. `deterministic` defaults to `torch.are_deterministic_algorithms_enabled()`."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return _grad_input_op(grad_out.contiguous(), weight.contiguous(), supports, num_features, deterministic)


@torch.library.custom_op("haste::group_sparse_topk", mutates_args=(), device_types="cuda")
def _topk_op(
    x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, bias: torch.Tensor | None, k: int, valid_count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    if _backend == "triton":
        return _load_triton().topk.group_sparse_topk(x, weight, supports, bias, k, valid_count)
    scores, columns = _load_extension().group_sparse_topk(x, weight, supports, bias, k, valid_count)
    scores, best = scores.topk(min(k, scores.shape[1]), dim=1)
    return scores, columns.gather(1, best)


@_topk_op.register_fake
def _(x, weight, supports, bias, k, valid_count):
    return x.new_empty(x.shape[0], k, dtype=torch.float32), x.new_empty(x.shape[0], k, dtype=torch.int64)


def group_sparse_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    valid_count: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `k` best (fp32 scores, columns) of each row of the tail's logits over columns `[0, valid_count)`,
    best first, without its `[B, K * G]` logits: each warp of the forward kernel keeps a list of the k best
    of each row over its labels; the lists (`O(B * k * 8 * blocks)`) are merged here. Tensor-core shapes only
    (`has_fast_path`); a row with fewer than k scored columns is padded with (-inf, -1)."""
    validate_inputs(x, weight, supports, bias, check_indices=VALIDATE)
    if not has_fast_path(x, weight):
        raise ValueError("`group_sparse_topk` needs tensor-core shapes (`has_fast_path`); score in chunks instead.")
    if k < 1:
        raise ValueError(f"`k` must be at least 1, got {k}.")
    return _topk_op(x.contiguous(), weight, supports, bias, k, valid_count)


def group_sparse_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    bias: torch.Tensor | None = None,
    deterministic: bool | None = None,
) -> torch.Tensor:
    """`[B, d] -> [B, K * G]` on the CUDA kernels, differentiable in `x`, `weight` and `bias`.

    Args:
        x: features `[B, d]` (bf16, fp16 or fp32).
        weight: `[K, G, F]`, dtype of `x`, contiguous.
        supports: int32 `[K, F]`, contiguous; distinct features in `[0, d)` per group.
        bias: optional `[K * G]`, added in the forward kernel's epilogue.
        deterministic: bitwise reproducible feature gradient (no floating-point atomics). Defaults to
            `torch.are_deterministic_algorithms_enabled()`.
    """
    validate_inputs(x, weight, supports, bias, check_indices=VALIDATE)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    return _forward_op(x.contiguous(), weight, supports, bias, deterministic)
