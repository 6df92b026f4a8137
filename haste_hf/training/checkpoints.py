# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What `HasteTrainer` checks of a checkpoint it resumes or loads from: that its model and label names are this run's,
and that its files load (a damaged one is named in a `ValueError`)."""

import json
import os
import pickle
from contextlib import contextmanager

from safetensors import SafetensorError
from transformers.utils import CONFIG_NAME

from ..modeling.configuration_haste import OUTPUT_LAYER_STRUCTURE_FIELDS
from ..modeling.label_names import LabelNameTable, first_difference
from ..modeling.saving import LABEL_NAMES_FILE


@contextmanager
def _reading(checkpoint: str | None, files: str):
    """Reports what the loaders raise on a damaged checkpoint file as a `ValueError` naming the checkpoint and file."""
    try:
        yield
    except (SafetensorError, pickle.UnpicklingError, EOFError, RuntimeError) as error:
        if checkpoint is None:
            raise
        message = " ".join(str(error).split()) or type(error).__name__
        raise ValueError(
            f"{checkpoint}: its {files} does not load ({message}); resume from an earlier checkpoint, or start afresh."
        ) from error


_ENCODER_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def checkpoint_model_differences(folder: str | os.PathLike, config) -> list[str]:
    """The settings in which the model of checkpoint `folder` differs from a model of `config` (a `HasteConfig`),
    each as `name is <checkpoint's> (this run: <config's>)`; [] when it has no readable config.json."""
    try:
        with open(os.path.join(folder, CONFIG_NAME), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return []
    pairs = [(name, saved.get(name), getattr(config, name, None)) for name in OUTPUT_LAYER_STRUCTURE_FIELDS]
    # How the output layer's features are read: a checkpoint trained on other features loads, and the run would go on
    # in silence. A config.json without `normalize` (written before the field) reads as False, as `from_pretrained`
    # reads it; one without `pooling` as this run's (it loads with its encoder family's default, unknown here).
    pooling, normalize = getattr(config, "pooling", None), getattr(config, "normalize", False)
    pairs += [
        ("pooling", saved.get("pooling", pooling), pooling),
        ("normalize", saved.get("normalize", False), normalize),
    ]
    encoder = saved.get("encoder") if isinstance(saved.get("encoder"), dict) else {}
    pairs += [(f"encoder {name}", encoder.get(name), getattr(config.encoder, name, None)) for name in _ENCODER_FIELDS]
    differences = [f"{name} is {theirs} (this run: {ours})" for name, theirs, ours in pairs if theirs != ours]
    # The tail's bias, a default of the recipe since issue 39 (a checkpoint of before has none; its weights would
    # load without it, and its optimizer state not): named with the flag that resumes it.
    theirs, ours = bool(saved.get("tail_bias", False)), bool(getattr(config, "tail_bias", False))
    if theirs != ours:
        differences.append(
            f"tail_bias is {theirs} (this run: {ours}; {'--' if theirs else '--no-'}tail-bias resumes it)"
        )
    return differences


def _name_at(names, index: int):
    """`names[index]`, or None where `names` is None, shorter or (a share) does not hold it."""
    if isinstance(names, LabelNameTable) and not names.held[0] <= index < names.held[1]:
        return None
    return names[index] if isinstance(names, (list, LabelNameTable)) and index < len(names) else None


def _saved_label_names(checkpoint: str):
    """The label names `checkpoint` was trained under: its label names files (a sharded save's, memory-mapped) or its
    `label_names.json`; None where it has neither."""
    from ..modeling.output_shards import OutputShards

    shards = OutputShards.open(checkpoint)
    if shards is not None and shards.has_label_names():
        return shards.label_names()
    path = os.path.join(checkpoint, LABEL_NAMES_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(
            f"{path} is not a JSON list of label names ({error}); resume from another checkpoint."
        ) from None


def check_label_names(checkpoint: str, ours) -> None:
    """Refuses a checkpoint trained under other label names than `ours` (the names of this run's model; same count,
    other names or order: the weights would continue under the wrong names). Where `ours` holds one rank's share of
    the names (a label-sharded run's, `LabelNameTable.held`), each rank compares its share and all of them refuse the
    first difference of any (collective: a rank alone refusing would leave the others waiting)."""
    theirs = _saved_label_names(checkpoint)
    if theirs is None:
        return
    named = isinstance(theirs, (list, LabelNameTable)) and ours is not None
    share = ours.held if isinstance(ours, LabelNameTable) and ours.held != (0, len(ours)) else None
    first = first_difference(theirs, ours, within=share) if named else 0
    difference = None if first is None else (first, _name_at(theirs, first), _name_at(ours, first))
    if share is not None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            found = [None] * dist.get_world_size()
            dist.all_gather_object(found, difference)
            difference = min((each for each in found if each is not None), default=None)
    if difference is not None:
        first, their_name, our_name = difference
        raise ValueError(
            f"{checkpoint} was trained under other label names: label {first} is {their_name!r} there "
            f"and {our_name!r} in this run. Resume it with the data it was trained with, or start "
            "afresh (--overwrite-output-dir)."
        )


__all__ = ["check_label_names", "checkpoint_model_differences"]
