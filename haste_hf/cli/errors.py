# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""How the command line fails: usage errors (status 2) and library errors (status 1), each one line."""

import sys


DEBUG_VARIABLE = "HASTE_HF_DEBUG"


class UsageError(Exception):
    """A bad argument, path or combination of them: reported in one line with exit status 2."""


def is_model_file_error(error: BaseException) -> bool:
    """Whether `error` is what loading a damaged or mismatched weights file raises: safetensors' own error, a pickle
    that does not unpickle (`torch.load` of an optimizer or argument file), a state dict of other shapes."""
    import pickle

    from safetensors import SafetensorError

    if isinstance(error, (SafetensorError, pickle.UnpicklingError)):
        return True
    return type(error) is RuntimeError and any(
        sign in str(error) for sign in ("state_dict", "ignore_mismatched_sizes", "size mismatch")
    )


def one_line(error: BaseException) -> str:
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


def report(prog: str, message: str) -> None:
    """`message` on a line of its own on stderr: a progress bar the error interrupted is closed first. One write of
    the whole line (`print` writes the text and its newline apart): the ranks of a torchrun share one stderr, and
    their lines must not run into each other."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()
    sys.stderr.write(f"{prog}: {message}\n")
    sys.stderr.flush()
