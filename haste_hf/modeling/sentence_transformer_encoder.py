# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""A SentenceTransformer as the encoder of a HASTE model: its transformer and pooling.

Read from a `SentenceTransformer` object or from its folder or Hub repository (`modules.json`), without
importing sentence-transformers, which stays optional. Only the module chain HASTE can reproduce is accepted:
Transformer, Pooling (cls, mean or last token) and an optional Normalize; anything else (Dense layers, max or
weighted-mean pooling, several pooling modes at once) is refused rather than silently dropped. The Normalize is
left out, with a warning (`warn_normalize_left_out`): HASTE fine-tunes the encoder, and unit-norm features train
worse (benchmarks/results/normalize_2026-11-27).

Flat and imports only transformers, so it is exported with the model's code.
"""

import json
import os
from pathlib import Path

from transformers.utils import cached_file

from .logging_utils import get_logger


logger = get_logger(__name__)

MODULES_FILE = "modules.json"
# sentence-transformers pooling modes HASTE implements, by their names in a Pooling config: the current
# `pooling_mode` values and the boolean keys of configs written before sentence-transformers 6.
_POOLING = {"cls": "cls", "mean": "mean", "lasttoken": "last_token"}
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def is_sentence_transformer(encoder) -> bool:
    return any(
        cls.__name__ == "SentenceTransformer" and cls.__module__.startswith("sentence_transformers")
        for cls in type(encoder).__mro__
    )


def from_sentence_transformer(model, pooling: str | None = None) -> tuple:
    """(the transformer `PreTrainedModel`, HASTE pooling, whether it ends in a Normalize) of a `SentenceTransformer`
    object; a given `pooling` replaces the model's own."""
    modules = list(model)
    names = [type(module).__name__ for module in modules]
    _check_chain(names, type(model).__name__)
    pooling = pooling or pooling_of(modules[1].get_config_dict())
    return modules[0].auto_model, pooling, names[-1] == "Normalize"


def sentence_transformer_folder(name_or_path, pooling: str | None = None, **hub_kwargs) -> tuple | None:
    """(subfolder of the transformer, HASTE pooling, whether it ends in a Normalize) of a SentenceTransformer saved in
    a folder or Hub repository, or None when `name_or_path` holds no `modules.json` (a plain transformers model); a
    given `pooling` replaces the model's own."""
    modules_file = _file(name_or_path, MODULES_FILE, hub_kwargs)
    if modules_file is None:
        return None
    with open(modules_file, encoding="utf-8") as f:
        modules = [(entry["type"].rsplit(".", 1)[-1], entry["path"]) for entry in json.load(f)]
    for _, path in modules:
        # A folder may come from anyone: its modules must lie inside it.
        if not isinstance(path, str) or os.path.isabs(path) or ".." in Path(path).parts:
            raise ValueError(f"{modules_file}: module path {path!r} points outside the model; it must be a subfolder")
    _check_chain([name for name, _ in modules], f"The SentenceTransformer in {name_or_path}")
    if pooling is None:
        pooling_path = modules[1][1]
        pooling_file = _file(name_or_path, f"{pooling_path}/config.json", hub_kwargs)
        if pooling_file is None:
            raise ValueError(
                f"The SentenceTransformer in {name_or_path} has no {pooling_path}/config.json: its pooling is unknown."
            )
        with open(pooling_file, encoding="utf-8") as f:
            pooling = pooling_of(json.load(f))
    return modules[0][1], pooling, modules[-1][0] == "Normalize"


def pooling_of(pooling_config: dict) -> str:
    """The HASTE pooling of a sentence-transformers Pooling config (current or legacy keys)."""
    modes = pooling_config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if pooling_config.get(key)]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in _POOLING:
        raise ValueError(
            f"The SentenceTransformer pools with {modes}; HASTE pools with one of {sorted(_POOLING)} (as 'cls', "
            "'mean', 'last_token'). Pass `pooling=` to choose one, knowing that the encoder was trained with another."
        )
    return _POOLING[modes[0]]


def warn_normalize_left_out(what: str) -> None:
    """Says that the SentenceTransformer `what` ends in a Normalize that HASTE leaves out (the command line and
    `from_encoder_pretrained` alike), and why."""
    logger.warning(
        f"{what} ends in a Normalize module, left out: HASTE fine-tunes the encoder, and unit-norm features trained "
        "4.2 PSP@5 worse on deps (benchmarks/results/normalize_2026-11-27)."
    )


def _check_chain(names: list[str], what: str):
    if names[:2] != ["Transformer", "Pooling"] or names[2:] not in ([], ["Normalize"]):
        raise ValueError(
            f"{what} has the modules {names}; HASTE reads Transformer, Pooling and an optional Normalize only "
            "(a Dense projection or other modules would be dropped). Pass its transformer model instead."
        )


def _file(name_or_path, filename: str, hub_kwargs: dict):
    return cached_file(
        name_or_path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )


__all__ = [
    "from_sentence_transformer",
    "is_sentence_transformer",
    "pooling_of",
    "sentence_transformer_folder",
    "warn_normalize_left_out",
]
