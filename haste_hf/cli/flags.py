# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The flags of `haste-hf train`, `demo` and `group` without importing transformers or torch.

Those flags are the fields of `RecipeArguments` and `HasteTrainingArguments`, turned into argparse actions by
`transformers.HfArgumentParser`, whose import (transformers, torch) takes seconds. `train_flags.json`, next to
this module, is a snapshot of those actions; the CLI builds its `--help` and checks the arguments (types, choices,
unknown flags) from it, and imports the dataclasses only once the arguments check out. The actions depend on the
versions of transformers and torch too (their fields, defaults and choices): under other versions than the
snapshot's, the first run reads them from the live parser (slower, as right) and keeps them in a cache file for
those versions and this package's code (`cache_path`), which later runs read as fast as the snapshot. The snapshot
is generated, never edited: after a field, its default or its help changes, or on upgrading transformers, rewrite
it with

    python -m haste_hf.cli.flags

(a test compares it with the live parser).
"""

import argparse
import functools
import hashlib
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path


SNAPSHOT_PATH = Path(__file__).with_name("train_flags.json")
REGENERATE_COMMAND = "python -m haste_hf.cli.flags"
# Where the flags read from the live parser under other versions than the snapshot's are kept.
CACHE_VARIABLE = "HASTE_HF_CACHE"
DATACLASS_NAMES = ("RecipeArguments", "HasteTrainingArguments")
VERSIONED_PACKAGES = ("transformers", "torch")
ACTION_KINDS = ("store", "store_true", "store_false")


def string_to_bool(text):
    """`transformers.hf_argparser.string_to_bool`, whose module imports torch: the same answers and message."""
    if isinstance(text, bool):
        return text
    if text.lower() in ("yes", "true", "t", "y", "1"):
        return True
    if text.lower() in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {text} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


def _type_name(action) -> str | None:
    """How the snapshot names an action's type: a builtin's name, `bool`, `choice`, or `other:NAME` for a type only
    the live parser can apply (the snapshot's parser passes that value on as text; the live parser checks it)."""
    if action.type is None or action.type in (int, float, str):
        return getattr(action.type, "__name__", None)
    name = getattr(action.type, "__qualname__", "")
    if name == "string_to_bool":
        return "bool"
    if name.startswith("make_choice_type_function."):
        return "choice"
    return f"other:{getattr(action.type, '__name__', repr(action.type))}"


def _choice_type(choices):
    by_text = {str(choice): choice for choice in choices}
    return lambda text: by_text.get(text, text)


def installed_versions() -> dict:
    """Without a local label (`2.13.0`, not `2.13.0+cpu`): a CPU and a CUDA build make the same flags."""
    return {package: version(package).split("+")[0] for package in VERSIONED_PACKAGES}


def _added_actions(dataclass) -> list[tuple[str, argparse.Action]]:
    """The argparse actions `HfArgumentParser` makes of `dataclass`, each with the action name it was added with,
    as `add_argument` hands them back (imports transformers)."""
    from transformers import HfArgumentParser

    added = []

    class RecordingParser(HfArgumentParser):
        def add_argument(self, *args, **kwargs):
            action = super().add_argument(*args, **kwargs)
            added.append((kwargs.get("action", "store"), action))
            return action

    if hasattr(dataclass, "_argument_group_name"):  # its flags would go to an argument group, past `add_argument`
        raise TypeError(f"{dataclass.__name__}: the snapshot has no form for an argument group; add one to {__name__}.")
    RecordingParser(dataclass, add_help=False)
    return added


def describe_live_flags() -> dict:
    """The argparse actions `HfArgumentParser` makes of each dataclass, as JSON-ready records, and the versions they
    were made under (imports transformers)."""
    from ..recipe_arguments import RecipeArguments
    from ..training.training_args import HasteTrainingArguments

    description = {"versions": installed_versions()}
    for dataclass in (RecipeArguments, HasteTrainingArguments):
        records = []
        for kind, action in _added_actions(dataclass):
            if kind not in ACTION_KINDS:
                raise TypeError(
                    f"{dataclass.__name__}.{action.dest}: the snapshot has no form for a {kind!r} action; add one to {__name__}."
                )
            records.append(
                dict(
                    option_strings=action.option_strings,
                    dest=action.dest,
                    action=kind,
                    type=_type_name(action),
                    nargs=action.nargs,
                    const=action.const,
                    choices=None if action.choices is None else list(action.choices),
                    default=action.default,
                    help=action.help,
                    required=action.required,
                    metavar=action.metavar,
                )
            )
        description[dataclass.__name__] = records
    return json.loads(json.dumps(description))


def write_snapshot(path: Path = SNAPSHOT_PATH) -> None:
    """One action a line, for short diffs when a field changes."""
    description = describe_live_flags()
    lines = [f'{{"versions": {json.dumps(description["versions"])}']
    for name in DATACLASS_NAMES:
        records = ",\n".join(json.dumps(record, ensure_ascii=False) for record in description[name])
        lines.append(f', "{name}": [\n{records}\n]')
    path.write_text("\n".join(lines) + "}\n", encoding="utf-8")


def cache_path(versions: dict) -> Path:
    """The cache file of the flags under `versions`: named by them and by a digest of this package's Python files,
    so that an edited field (an editable install) or another release of the package is read again. In
    `$HASTE_HF_CACHE`, else `$XDG_CACHE_HOME/haste_hf` (`~/.cache/haste_hf`)."""
    package = Path(__file__).parents[1]  # haste_hf: the dataclasses' fields and their help live across it
    digest = hashlib.sha256()
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode())
        digest.update(source.read_bytes())
    folder = os.environ.get(CACHE_VARIABLE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "haste_hf"
    )
    name = "-".join(f"{package}{versions[package]}" for package in VERSIONED_PACKAGES)
    return Path(folder) / f"train_flags-{name}-{digest.hexdigest()[:16]}.json"


def _write_cache(path: Path, description: dict) -> None:
    """Written whole or not at all (a temporary file renamed); a cache that cannot be written is done without."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False, encoding="utf-8") as f:
            json.dump(description, f)
        os.replace(f.name, path)
    except OSError:
        return


@functools.cache
def flag_description() -> dict:
    """The snapshot, or under other versions of transformers and torch than its own (or without a readable snapshot),
    the actions the live parser made under these versions (cached, see `cache_path`)."""
    try:
        snapshot = json.loads(SNAPSHOT_PATH.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # missing (a package built without it) or damaged: slower, as right
        snapshot = None
    versions = installed_versions()
    if isinstance(snapshot, dict) and snapshot.get("versions") == versions:
        return snapshot
    cached = cache_path(versions)
    try:
        description = json.loads(cached.read_text(encoding="utf-8"))
        if description.get("versions") == versions and all(name in description for name in DATACLASS_NAMES):
            return description
    except (OSError, ValueError):
        pass
    description = describe_live_flags()
    _write_cache(cached, description)
    return description


def flag_records() -> list[dict]:
    """The description of every flag of the dataclasses, in their order."""
    return [record for name in DATACLASS_NAMES for record in flag_description()[name]]


def field_names() -> set[str]:
    """The names of the dataclasses' fields that are flags (the keys a `--config` file may have)."""
    return {record["dest"] for record in flag_records()}


def flags_parser(*dataclass_names: str) -> argparse.ArgumentParser:
    """A parent parser with the actions `HfArgumentParser(dataclasses)` makes, built from their description."""
    description = flag_description()
    parser = argparse.ArgumentParser(add_help=False)
    for name in dataclass_names:
        for record in description[name]:
            options = dict(
                dest=record["dest"], default=record["default"], help=record["help"], required=record["required"]
            )
            if record["action"] == "store":
                kind = record["type"]
                types = {"int": int, "float": float, "str": str, "bool": string_to_bool}
                options.update(
                    nargs=record["nargs"],
                    const=record["const"],
                    choices=record["choices"],
                    metavar=record["metavar"],
                    type=_choice_type(record["choices"]) if kind == "choice" else types.get(kind),
                )
            parser.add_argument(*record["option_strings"], action=record["action"], **options)
    return parser


if __name__ == "__main__":
    write_snapshot()
    print(f"wrote {SNAPSHOT_PATH}")
