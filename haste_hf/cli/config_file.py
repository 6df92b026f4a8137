# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`--config FILE`: a YAML or JSON file of flag values, read strictly (no duplicate keys, no unknown keys) and
checked against the flags' types, naming the key at fault."""

import argparse
import json
import os
from pathlib import Path

from .errors import UsageError


def _yaml_without_duplicate_keys(text: str, path: str):
    """`yaml.safe_load(text)`, refusing a mapping that repeats a key (YAML keeps the last one in silence)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise UsageError(
                        f"argument --config: {path}: key {key!r} is given twice (line {key_node.start_mark.line + 1}); keep one."
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # a SafeLoader: no object is built from a tag


def _json_object_without_duplicate_keys(path: str):
    def build(pairs):
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise UsageError(f"argument --config: {path}: key {repeated!r} is given twice; keep one.")
        return dict(pairs)

    return build


def read_config_file(path: str, known: set[str]) -> dict:
    """Flag values from a JSON or YAML mapping; unknown keys are refused with the nearest known name, and a key
    given twice (also as `learning-rate` and `learning_rate`) is refused."""
    import difflib

    if not os.path.isfile(path):
        raise UsageError(f"argument --config: no file {path!r}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"argument --config: {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            values = _yaml_without_duplicate_keys(text, path)
        except yaml.YAMLError as error:
            raise UsageError(f"argument --config: {path} is not valid YAML: {error}") from None
    else:
        try:
            values = json.loads(text, object_pairs_hook=_json_object_without_duplicate_keys(path))
        except ValueError as error:
            raise UsageError(f"argument --config: {path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise UsageError(
            f"argument --config: {path}: expected a mapping of flag names to values, got {type(values).__name__}."
        )
    normalized = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise UsageError(f"argument --config: {path}: key {key!r} is not a flag name.")
        name = key.replace("-", "_")
        if name in normalized:
            raise UsageError(f"argument --config: {path}: {name!r} is given twice (as {key!r} too); keep one.")
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            raise UsageError(
                f"argument --config: {path}: unknown key {name!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + "."
            )
        normalized[name] = value
    return normalized


def check_config_values(path: str, values: dict, flag_records: list[dict], may_be_null: set[str]) -> None:
    """Refuses a config value of the wrong type for its flag, naming the key: argparse checks a default only
    when it is a string, and then names the flag but not the file, so `fan_in: 6.7` or `batch_size: null`
    would reach the run unchecked. `flag_records`: the flags as `flags.flag_description` describes them;
    `may_be_null`: the fields whose type allows None."""
    from .flags import string_to_bool

    records = {record["dest"]: record for record in flag_records}
    for key, value in values.items():
        record = records.get(key)
        if record is None:
            continue
        if value is None:
            if key not in may_be_null:
                raise UsageError(f"argument --config: {path}: {key!r} is null; give a value or leave the key out.")
            continue
        kind = {"int": int, "float": float, "bool": string_to_bool}.get(record["type"])
        choices = record["choices"]
        items = value if isinstance(value, list) and record["nargs"] in ("+", "*") else [value]
        for item in items:
            if choices is not None:
                # As the flag reads its text: a choice by its printed form, or through the flag's type.
                by_text = {str(choice): choice for choice in choices}
                choice = (kind(item) if kind else by_text.get(item, item)) if isinstance(item, str) else item
                ok, expected = choice in choices, f"one of {', '.join(map(str, choices))}"
            elif kind is None:
                continue
            elif isinstance(item, str):  # as the flag's text: "1e-4" (YAML reads it as a string), "true"
                try:
                    ok = kind(item) is not None
                except (TypeError, ValueError, argparse.ArgumentTypeError):  # string_to_bool's refusal
                    ok = False
                expected = {int: "an integer", float: "a number", string_to_bool: "true or false"}[kind]
            elif kind is int:
                ok, expected = isinstance(item, int) and not isinstance(item, bool), "an integer"
            elif kind is float:
                ok, expected = isinstance(item, (int, float)) and not isinstance(item, bool), "a number"
            else:
                ok, expected = isinstance(item, bool), "true or false"
            if not ok:
                raise UsageError(f"argument --config: {path}: {key!r} must be {expected}, got {item!r}.")
