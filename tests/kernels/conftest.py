# Copyright 2026 The haste_hf Authors. Apache-2.0.
import pytest

from haste_hf.kernels import ops


@pytest.fixture(params=ops.BACKENDS)
def backend(request):
    """Each backend of the custom ops in turn (Triton, the CUDA build), restored afterwards."""
    previous = ops.backend()
    ops.set_backend(request.param)
    yield request.param
    ops.set_backend(previous)
