# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Triton kernels of the group-shared sparse tail, one kernel a file (Liger-Kernel's layout):

- `forward.py`: the logits `[B, K * G]` (+ bias) of `x [B, d]`, `weight [K, G, F]`, `supports [K, F]`;
- `loss.py`: the fused loss (BCE, squared hinge): in the tail's forward epilogue, and elementwise on a dense
  head's materialised logits;
- `topk.py`: the tail's forward with a k-best list per program instead of logits;
- `grad_weight.py`, `grad_input.py`: the two backward passes.

Each file exposes a plain launch function taking and returning torch tensors; `haste_hf.kernels.ops` registers
them as `torch.library` custom ops. The modules import `triton` at their top: import them only when
`is_available()` says so (Triton ships with torch's CUDA wheels; a CPU-only install may lack it).
"""

from ...import_utils import is_triton_available


def is_available() -> bool:
    """Whether Triton can be imported (it compiles these kernels on first use, no other toolchain needed)."""
    return is_triton_available()


__all__ = ["is_available"]
