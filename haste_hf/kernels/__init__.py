# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The compiled group-sparse kernels (`ops`: torch.library custom ops, built from the top-level `csrc/`) and the
fused Triton SGD update (`triton_sgd`). Both are optional: the model falls back to PyTorch without them."""
