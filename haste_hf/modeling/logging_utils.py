# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The one way haste_hf's modules get their logger.

Each logger sits under transformers' library logger ("transformers.haste_hf.*") and follows its verbosity, as
sentence-transformers and peft users expect: `transformers.logging.set_verbosity_error()` or
`TRANSFORMERS_VERBOSITY=error` silence haste_hf's warnings too, and they print through transformers' handler.
Exported with the model's code (it imports only transformers).
"""

from transformers.utils import logging


def get_logger(module_name: str) -> logging.logging.Logger:
    """The logger of the module named `module_name` (pass `__name__`)."""
    return logging.get_logger(f"transformers.{module_name}")


__all__ = ["get_logger"]
