"""The benchmark scripts for their tests: `benchmarks/` is no package (each script runs alone, on the device or
here), so a test imports a script by its path."""

import importlib.util
import sys
from pathlib import Path


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(path: Path, register: bool = False):
    """The script at `path`, run as a fresh module named by its file. `register`: the module is put in `sys.modules`
    under that name first, where its dataclasses and worker processes look it up (the caller removes it)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str, register: bool = False):
    """`benchmarks/<name>.py` (`load_script`)."""
    return load_script(BENCHMARKS / f"{name}.py", register)
