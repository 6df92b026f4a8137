# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Optional dependencies, looked up one way: whether a package is installed, without importing it.

Two places keep `try: import ... except ImportError` on purpose: files copied beside a model or an export
(`model_sources.py`, `onnx_serving.py`) import nothing of the package, and transformers' remote-code loader
accepts an uninstalled import only inside such a block.
"""

import importlib.util


EXPORT_PACKAGES = ("onnx", "onnxscript", "onnxruntime")


def is_package_available(name: str) -> bool:
    """Whether `name` can be imported (looked up at each call: installing a package mid-session counts)."""
    return importlib.util.find_spec(name) is not None


def missing_packages(names) -> list[str]:
    return [name for name in names if not is_package_available(name)]


def is_peft_available() -> bool:
    return is_package_available("peft")


def is_triton_available() -> bool:
    return is_package_available("triton")


__all__ = [
    "EXPORT_PACKAGES",
    "is_package_available",
    "is_peft_available",
    "is_triton_available",
    "missing_packages",
]
