# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The Triton kernels' tests run on the GPU when there is one, else on CPU tensors through Triton's interpreter
(`TRITON_INTERPRET=1`, set by the top-level conftest before anything imports a kernel).

Two bugs of the interpreter are mended here, for the tests only (the compiled kernels never meet them):
- with numpy >= 2.4, `range()` over a run-time value fails ("only 0-dimensional arrays can be converted to Python
  scalars"; triton-lang/triton#9171, fixed upstream after 3.6);
- `tl.dot` on bfloat16 multiplies the raw uint16 storage (the interpreter keeps bf16 as uint16): operands are
  widened to float32 first, exactly (a bf16 is the upper half of an fp32);
- float32 -> bfloat16 casts truncate: they round to nearest even here, as the GPU does.
"""

import os

import numpy as np
import pytest
import torch


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"


def _mend_interpreter():
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patch_lang_tensor

    create_dot = interpreter.InterpreterBuilder.create_dot

    def widened(handle):
        if handle.dtype.is_bf16():
            data = (handle.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, interpreter.tl.float32)
        return handle

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = dot

    cast = interpreter.InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar.is_fp32() and dst_type.scalar.is_bf16():
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
            return interpreter.TensorHandle(rounded, dst_type.scalar)
        return cast(self, src, dst_type)

    interpreter.InterpreterBuilder.cast_impl = cast_impl


if INTERPRETED:
    _mend_interpreter()


@pytest.fixture
def device():
    """Where the kernels run: the GPU, or the CPU through Triton's interpreter."""
    if not INTERPRETED and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1")
    return DEVICE
