# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The `haste-hf` command line. Importing it loads neither torch nor transformers: `haste-hf --help` answers at once."""

from .commands import main


__all__ = ["main"]
