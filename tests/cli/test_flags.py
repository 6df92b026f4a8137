"""`haste_hf.cli.flags`: the flags of `train`, `demo` and `group` as the snapshot (or the cache, or the live parser)
describes them, and the parser built from that description: each decision of the module against a value given by
hand, not against the module's own answer."""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from haste_hf.cli import flags


TRUE_TEXTS = ("yes", "true", "t", "y", "1")
FALSE_TEXTS = ("no", "false", "f", "n", "0")


@pytest.mark.parametrize("text", [*TRUE_TEXTS, *(text.upper() for text in TRUE_TEXTS)])
def test_truthy_texts_read_as_true(text):
    assert flags.string_to_bool(text) is True


@pytest.mark.parametrize("text", [*FALSE_TEXTS, *(text.upper() for text in FALSE_TEXTS)])
def test_falsy_texts_read_as_false(text):
    assert flags.string_to_bool(text) is False


@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_its_own_truth_value(value):
    assert flags.string_to_bool(value) is value


@pytest.mark.parametrize("text", ["maybe", "", "2", "on"])
def test_other_texts_are_refused_naming_the_accepted_ones(text):
    with pytest.raises(argparse.ArgumentTypeError, match=f"got {text} but expected one of yes/no, true/false"):
        flags.string_to_bool(text)


def _action(type_function):
    return argparse.ArgumentParser().add_argument("--value", type=type_function)


def _choice_function(text):
    return text


_choice_function.__qualname__ = "make_choice_type_function.<locals>.<lambda>"  # as transformers names it


@pytest.mark.parametrize(
    "type_function, name",
    [
        (None, None),
        (int, "int"),
        (float, "float"),
        (str, "str"),
        (flags.string_to_bool, "bool"),
        (_choice_function, "choice"),
        (Path, "other:Path"),
    ],
)
def test_the_snapshot_names_each_kind_of_type(type_function, name):
    assert flags._type_name(_action(type_function)) == name


def test_a_choice_reads_back_as_the_choice_its_text_names_and_other_text_as_it_is():
    to_choice = flags._choice_type([1, 2.5, "mean"])
    assert [to_choice(text) for text in ("1", "2.5", "mean", "max")] == [1, 2.5, "mean", "max"]
    assert type(to_choice("1")) is int and type(to_choice("2.5")) is float


def test_installed_versions_leave_out_a_builds_local_label(monkeypatch):
    given = {"transformers": "5.24.0", "torch": "2.13.0+cu128"}
    monkeypatch.setattr(flags, "version", given.__getitem__)
    assert flags.installed_versions() == {"transformers": "5.24.0", "torch": "2.13.0"}


@dataclasses.dataclass
class _Fields:
    count: int = 3
    pooling: Literal["mean", "cls"] = "mean"
    quiet: bool = False


def test_the_actions_recorded_are_those_the_live_parser_adds():
    added = flags._added_actions(_Fields)
    by_dest = {action.dest: (kind, action) for kind, action in added}
    assert set(by_dest) >= {"count", "pooling", "quiet"}
    assert all(isinstance(action, argparse.Action) for _, action in added)
    assert by_dest["count"][1].type is int and by_dest["count"][1].default == 3
    assert list(by_dest["pooling"][1].choices) == ["mean", "cls"]


def test_a_dataclass_whose_flags_go_to_an_argument_group_is_refused():
    @dataclasses.dataclass
    class Grouped:
        _argument_group_name = "grouped"
        count: int = 3

    with pytest.raises(TypeError, match="Grouped: the snapshot has no form for an argument group"):
        flags._added_actions(Grouped)


def test_an_action_kind_the_snapshot_cannot_describe_is_refused(monkeypatch):
    action = argparse.ArgumentParser().add_argument("--many", action="append")
    monkeypatch.setattr(flags, "_added_actions", lambda dataclass: [("append", action)])
    with pytest.raises(TypeError, match=r"RecipeArguments\.many: the snapshot has no form for a 'append' action"):
        flags.describe_live_flags()


def test_the_live_description_records_each_action_as_json(monkeypatch):
    parser = argparse.ArgumentParser()
    actions = [
        ("store", parser.add_argument("--pooling", type=_choice_function, choices=("mean", "cls"), default="mean")),
        ("store", parser.add_argument("--count", type=int, default=3, help="how many")),
        ("store_true", parser.add_argument("--quiet", action="store_true")),
    ]
    monkeypatch.setattr(flags, "_added_actions", lambda dataclass: actions)
    monkeypatch.setattr(flags, "installed_versions", lambda: {"transformers": "5.0.0", "torch": "2.0.0"})
    description = flags.describe_live_flags()
    assert description["versions"] == {"transformers": "5.0.0", "torch": "2.0.0"}
    pooling, count, quiet = description["RecipeArguments"]
    assert pooling["choices"] == ["mean", "cls"] and pooling["type"] == "choice" and pooling["action"] == "store"
    assert count["choices"] is None and count["type"] == "int" and count["default"] == 3 and count["help"] == "how many"
    assert quiet["action"] == "store_true" and quiet["option_strings"] == ["--quiet"]
    assert description["HasteTrainingArguments"] == description["RecipeArguments"]


def test_the_snapshot_written_is_the_live_description_one_action_a_line(tmp_path):
    path = tmp_path / "train_flags.json"
    flags.write_snapshot(path)
    text = path.read_text(encoding="utf-8")
    description = json.loads(text)
    assert description == flags.describe_live_flags()
    records = sum(len(description[name]) for name in flags.DATACLASS_NAMES)
    assert len(text.splitlines()) == 1 + records + 2 * len(flags.DATACLASS_NAMES)


def _fake_package(root: Path) -> None:
    (root / "haste_hf" / "cli").mkdir(parents=True)
    (root / "haste_hf" / "cli" / "flags.py").write_text("# the module\n")
    (root / "haste_hf" / "fields.py").write_text("count = 3\n")
    (root / "beside.py").write_text("# not the package's\n")


VERSIONS = {"transformers": "5.1.0", "torch": "2.9.0"}


def test_the_cache_file_is_named_by_the_versions_and_a_digest_of_the_packages_code_alone(monkeypatch, tmp_path):
    _fake_package(tmp_path)
    monkeypatch.setattr(flags, "__file__", str(tmp_path / "haste_hf" / "cli" / "flags.py"))
    monkeypatch.setenv(flags.CACHE_VARIABLE, str(tmp_path / "cache"))
    first = flags.cache_path(VERSIONS)
    assert first.parent == tmp_path / "cache"
    stem, _, digest = first.name.removesuffix(".json").rpartition("-")
    assert stem == "train_flags-transformers5.1.0-torch2.9.0" and len(digest) == 16 and first.suffix == ".json"
    (tmp_path / "beside.py").write_text("# edited, outside the package\n")
    assert flags.cache_path(VERSIONS) == first
    (tmp_path / "haste_hf" / "fields.py").write_text("count = 4\n")  # a field edited in an editable install
    assert flags.cache_path(VERSIONS) != first
    assert flags.cache_path({**VERSIONS, "torch": "2.10.0"}).name != flags.cache_path(VERSIONS).name


def test_the_cache_folder_is_the_variables_else_xdgs_else_the_homes(monkeypatch, tmp_path):
    monkeypatch.setenv(flags.CACHE_VARIABLE, str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert flags.cache_path(VERSIONS).parent == tmp_path / "mine"
    monkeypatch.delenv(flags.CACHE_VARIABLE)
    assert flags.cache_path(VERSIONS).parent == tmp_path / "xdg" / "haste_hf"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert flags.cache_path(VERSIONS).parent == tmp_path / "home" / ".cache" / "haste_hf"


def test_a_cache_that_cannot_be_written_is_done_without(tmp_path):
    (tmp_path / "a_file").write_text("")
    flags._write_cache(tmp_path / "a_file" / "cache.json", {"versions": VERSIONS})  # its folder is a file: no error
    flags._write_cache(tmp_path / "cache" / "flags.json", {"versions": VERSIONS})
    assert json.loads((tmp_path / "cache" / "flags.json").read_text()) == {"versions": VERSIONS}
    assert os.listdir(tmp_path / "cache") == ["flags.json"]


LIVE = {"versions": VERSIONS, "RecipeArguments": [{"dest": "live"}], "HasteTrainingArguments": []}


@pytest.fixture
def sources(monkeypatch, tmp_path):
    """The snapshot and the cache folder in `tmp_path`, these versions installed, and the live parser counted."""
    snapshot = tmp_path / "train_flags.json"
    monkeypatch.setattr(flags, "SNAPSHOT_PATH", snapshot)
    monkeypatch.setenv(flags.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(flags, "installed_versions", lambda: dict(VERSIONS))
    live_calls = []
    monkeypatch.setattr(flags, "describe_live_flags", lambda: live_calls.append(1) or json.loads(json.dumps(LIVE)))
    flags.flag_description.cache_clear()
    yield snapshot, flags.cache_path(VERSIONS), live_calls
    flags.flag_description.cache_clear()


def test_a_snapshot_of_these_versions_is_read_and_nothing_else(sources):
    snapshot, cache, live_calls = sources
    description = {"versions": VERSIONS, "RecipeArguments": [{"dest": "snapshot"}], "HasteTrainingArguments": []}
    snapshot.write_text(json.dumps(description))
    assert flags.flag_description() == description and live_calls == [] and not cache.exists()


@pytest.mark.parametrize(
    "text", [json.dumps({"versions": {**VERSIONS, "torch": "2.8.0"}}), json.dumps([VERSIONS]), "{damaged", None]
)
def test_a_snapshot_of_other_versions_damaged_or_missing_gives_the_live_flags_kept_in_the_cache(sources, text):
    snapshot, cache, live_calls = sources
    if text is not None:
        snapshot.write_text(text)
    assert flags.flag_description() == LIVE and live_calls == [1]
    assert json.loads(cache.read_text()) == LIVE


def test_a_cache_of_these_versions_is_read_without_the_live_parser(sources):
    _, cache, live_calls = sources
    cached = {"versions": VERSIONS, "RecipeArguments": [{"dest": "cached"}], "HasteTrainingArguments": []}
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(cached))
    assert flags.flag_description() == cached and live_calls == []


@pytest.mark.parametrize(
    "cached",
    [
        {"versions": {**VERSIONS, "transformers": "5.0.0"}, "RecipeArguments": [], "HasteTrainingArguments": []},
        {"versions": VERSIONS, "RecipeArguments": []},  # a dataclass missing
        {"versions": VERSIONS},
    ],
)
def test_a_cache_of_other_versions_or_incomplete_is_read_again_from_the_live_parser(sources, cached):
    _, cache, live_calls = sources
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps(cached))
    assert flags.flag_description() == LIVE and live_calls == [1]
    assert json.loads(cache.read_text()) == LIVE


def _record(dest, action="store", kind=None, choices=None, default=None, nargs=None, const=None):
    return dict(
        option_strings=[f"--{dest.replace('_', '-')}", f"--{dest}"] if "_" in dest else [f"--{dest}"],
        dest=dest,
        action=action,
        type=kind,
        nargs=nargs,
        const=const,
        choices=choices,
        default=default,
        help=f"the {dest}",
        required=False,
        metavar=None,
    )


DESCRIPTION = {
    "versions": VERSIONS,
    "RecipeArguments": [
        _record("fan_in", kind="int", default=8),
        _record("rate", kind="float", default=0.5),
        _record("name", kind="str"),
        _record("pooling", kind="choice", choices=["mean", "cls", 3], default="mean"),
        _record("label_texts", kind="bool", default=False, nargs="?", const=True),
        _record("target", kind="other:Path"),
    ],
    "HasteTrainingArguments": [
        _record("quiet", action="store_true", default=False),
        _record("loud", action="store_false", default=True),
    ],
}


@pytest.fixture
def described(monkeypatch):
    monkeypatch.setattr(flags, "flag_description", lambda: json.loads(json.dumps(DESCRIPTION)))


def test_records_and_field_names_follow_the_description(described):
    assert [record["dest"] for record in flags.flag_records()] == [
        "fan_in",
        "rate",
        "name",
        "pooling",
        "label_texts",
        "target",
        "quiet",
        "loud",
    ]
    assert flags.field_names() == {"fan_in", "rate", "name", "pooling", "label_texts", "target", "quiet", "loud"}


def test_the_parser_built_from_the_description_applies_each_type(described):
    parser = flags.flags_parser(*flags.DATACLASS_NAMES)
    defaults = vars(parser.parse_args([]))
    assert defaults == dict(
        fan_in=8, rate=0.5, name=None, pooling="mean", label_texts=False, target=None, quiet=False, loud=True
    )
    given = vars(
        parser.parse_args(
            ["--fan-in", "4", "--rate", "0.25", "--name", "x", "--pooling", "3", "--label-texts", "no"]
            + ["--target", "out", "--quiet", "--loud"]
        )
    )
    assert given == dict(
        fan_in=4, rate=0.25, name="x", pooling=3, label_texts=False, target="out", quiet=True, loud=False
    )
    assert type(given["fan_in"]) is int and type(given["pooling"]) is int
    assert parser.parse_args(["--label-texts"]).label_texts is True


def test_a_parser_of_one_dataclass_has_only_its_flags(described):
    parser = flags.flags_parser("HasteTrainingArguments")
    assert vars(parser.parse_args(["--quiet"])) == {"quiet": True, "loud": True}
    with pytest.raises(SystemExit):
        parser.parse_args(["--fan-in", "4"])


def test_importing_the_module_rewrites_nothing_and_imports_no_transformers():
    before = flags.SNAPSHOT_PATH.stat().st_mtime_ns
    run = subprocess.run(
        [sys.executable, "-c", "import sys, haste_hf.cli.flags; print('transformers' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False"]
    assert flags.SNAPSHOT_PATH.stat().st_mtime_ns == before
