# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What `haste-hf add-labels` reads: the new labels' file, their examples and negatives from dataset splits."""

import json
from pathlib import Path

import torch


def read_new_labels(path) -> tuple[list[str], list[str] | None]:
    """`(texts, names)` of a new-labels JSON file: a list of `{"text": ..., "name": ...}` objects (`name` optional,
    given for all or none), or an object mapping names to texts."""

    def unique_keys(pairs: list) -> dict:
        seen = set()
        for key, _ in pairs:
            if key in seen:  # `json` keeps the last: one label of the two, without a word
                raise ValueError(f"{path} names {key!r} twice: give each new label (and each entry's key) once")
            seen.add(key)
        return dict(pairs)

    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file ({error})") from None
    if isinstance(entries, dict):
        return list(entries.values()), list(entries)
    if not isinstance(entries, list) or not all(isinstance(entry, dict) and "text" in entry for entry in entries):
        raise ValueError(f'{path} must hold a list of {{"text": ..., "name": ...}} objects, or an object of name: text')
    named = ["name" in entry for entry in entries]
    if any(named) and not all(named):
        raise ValueError(f"{path}: entry {named.index(False)} has no name; name every new label, or none")
    return [entry["text"] for entry in entries], ([entry["name"] for entry in entries] if all(named) else None)


def examples_from_split(split, count: int) -> list[list[str]]:
    """One list of example texts per new label from a dataset split whose label ids index the new labels."""
    examples = [[] for _ in range(count)]
    for text, labels in zip(split["text"], split["labels"]):
        for label in labels:
            if not 0 <= label < count:
                raise ValueError(f"the examples tag label {label}, and the new labels are 0 to {count - 1}")
            examples[label].append(text)
    return examples


def sample_texts(split, count: int, seed: int) -> list[str]:
    """`count` texts of `split` drawn at random (all of them when it holds fewer)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(len(split), generator=generator)[:count].sort().values.tolist()
    return list(split.select(rows)["text"])


__all__ = ["examples_from_split", "read_new_labels", "sample_texts"]
