# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Writing outputs all-or-nothing: a trained model folder (model, tokenizer, card and extra files switched
in at once) and single output files (predictions, metrics, groupings).

The folder switch itself lives in `modeling_haste.save_folder_atomically`, next to the check that loading
makes, because exported remote code saves and loads without this package; this module sits above the
model and composes it.
"""

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .modeling_haste import save_folder_atomically


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary path beside `path` to write to; it replaces `path` only when the block ends
    without an error, so `path` is never half-written. The folder of `path` must exist."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it first.")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
    os.close(handle)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_trained_folder(folder: str | os.PathLike, model, tokenizer=None, write_extra=None, state_dict=None) -> None:
    """Saves `model` (weights, configuration, label names, exportable code), `tokenizer` and whatever `write_extra(staging)`
    writes (card, metrics) into `folder` in one switch: a failure or a kill leaves the previous contents,
    or a folder that loading refuses, never a model without its tokenizer or card. `state_dict`: the
    weights to write instead of the model's own (a sharded output layer's gathered shares)."""

    def write(staging):
        model.save_pretrained(staging, state_dict=state_dict)  # the exportable code goes along (see haste_hf/__init__.py)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if write_extra is not None:
            write_extra(Path(staging))

    save_folder_atomically(os.fspath(folder), write)


__all__ = ["atomic_path", "save_trained_folder"]
