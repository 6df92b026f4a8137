# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What every launch of these kernels asks of the device: its context, and how many multiprocessors it has."""

import contextlib
import functools

import torch


def on_device(tensor: torch.Tensor):
    """The context that sends a launch to `tensor`'s GPU (not the current one); nothing on the CPU (interpreter)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


@functools.cache
def processor_count(device: torch.device) -> int:
    """Multiprocessors of `device` (the grids are sized by it); 4 on the CPU, where the interpreter runs them."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


__all__ = ["on_device", "processor_count"]
