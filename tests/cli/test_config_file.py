"""`--config FILE` read strictly (`haste_hf.cli.config_file`): a mapping of known flag names, each value of its
flag's type, and a one-line `UsageError` naming the file and the key for anything else."""

import pytest

from haste_hf.cli.config_file import check_config_values, read_config_file
from haste_hf.cli.errors import UsageError


KNOWN = {"learning_rate", "fan_in", "tags", "bf16", "pooling"}
RECORDS = [
    {"dest": "learning_rate", "type": "float", "choices": None, "nargs": None},
    {"dest": "fan_in", "type": "int", "choices": None, "nargs": None},
    {"dest": "bf16", "type": "bool", "choices": None, "nargs": None},
    {"dest": "pooling", "type": None, "choices": ["mean", "cls"], "nargs": None},
    {"dest": "tags", "type": "int", "choices": None, "nargs": "+"},
]


def written(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


@pytest.mark.parametrize("name", ["run.json", "run.yaml", "run.yml"])
def test_a_mapping_is_read_with_dashes_as_underscores(tmp_path, name):
    text = '{"learning-rate": 0.001, "fan_in": 8}' if name.endswith("json") else "learning-rate: 0.001\nfan_in: 8\n"
    assert read_config_file(written(tmp_path, name, text), KNOWN) == {"learning_rate": 0.001, "fan_in": 8}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("run.json", "[1, 2]", r"run.json: expected a mapping of flag names to values, got list\.$"),
        ("run.yaml", "- 1\n- 2\n", r"run.yaml: expected a mapping of flag names to values, got list\.$"),
        ("run.json", '"fan_in"', r"expected a mapping of flag names to values, got str\.$"),
        ("run.json", "{fan_in: 8}", r"run.json is not valid JSON"),
        ("run.yaml", "fan_in: [8\n", r"run.yaml is not valid YAML"),
        ("run.json", b'{"fan_in": "\xff"}', r"run.json is not UTF-8 text"),
        ("run.json", '{"fan_in": 8, "fan_in": 9}', r"key 'fan_in' is given twice; keep one\.$"),
        ("run.yaml", "fan_in: 8\nfan_in: 9\n", r"key 'fan_in' is given twice \(line 2\); keep one\.$"),
        ("run.yaml", "8: 1\n", r"key 8 is not a flag name\.$"),
        ("run.json", '{"fan-in": 8, "fan_in": 9}', r"'fan_in' is given twice \(as 'fan_in' too\); keep one\.$"),
        ("run.json", '{"fan_inn": 8}', r"unknown key 'fan_inn' \(did you mean 'fan_in'\?\)\.$"),
        ("run.json", '{"zzzz": 8}', r"unknown key 'zzzz'\.$"),
    ],
)
def test_anything_but_a_mapping_of_known_flags_is_refused_naming_the_file(tmp_path, name, text, message):
    with pytest.raises(UsageError, match=r"^argument --config: .*" + message):
        read_config_file(written(tmp_path, name, text), KNOWN)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(UsageError, match=r"^argument --config: no file '.*nothing.json'$"):
        read_config_file(str(tmp_path / "nothing.json"), KNOWN)


def test_values_of_their_flags_type_pass():
    values = {"learning_rate": 1, "fan_in": 8, "bf16": "true", "pooling": "cls", "tags": [1, 2], "other": object()}
    check_config_values("run.yaml", values, RECORDS, may_be_null=set())
    check_config_values("run.yaml", {"learning_rate": "1e-4", "fan_in": None, "bf16": False}, RECORDS, {"fan_in"})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"fan_in": None}, r"'fan_in' is null; give a value or leave the key out\.$"),
        ({"fan_in": 6.7}, r"'fan_in' must be an integer, got 6\.7\.$"),
        ({"fan_in": True}, r"'fan_in' must be an integer, got True\.$"),
        ({"fan_in": "six"}, r"'fan_in' must be an integer, got 'six'\.$"),
        ({"learning_rate": True}, r"'learning_rate' must be a number, got True\.$"),
        ({"bf16": 1}, r"'bf16' must be true or false, got 1\.$"),
        ({"bf16": "maybe"}, r"'bf16' must be true or false, got 'maybe'\.$"),
        ({"pooling": "max"}, r"'pooling' must be one of mean, cls, got 'max'\.$"),
        ({"tags": [1, 2.5]}, r"'tags' must be an integer, got 2\.5\.$"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_key(values, message):
    with pytest.raises(UsageError, match=r"^argument --config: run.yaml: " + message):
        check_config_values("run.yaml", values, RECORDS, may_be_null=set())


def test_the_config_path_is_the_value_after_the_flag_or_after_its_equals_sign():
    from haste_hf.cli.parser import _config_path

    assert _config_path(["train", "--config", "run.yaml", "--fan-in", "8"]) == "run.yaml"
    assert _config_path(["train", "--config=a=b.yaml"]) == "a=b.yaml"
    assert _config_path(["train", "--fan-in", "8"]) is None
    assert _config_path(["train", "--config"]) is None  # no value: argparse names the flag


def test_positive_flags_name_the_kind_they_expect():
    import argparse

    from haste_hf.cli.parser import _positive

    assert _positive(int)("3") == 3 and _positive(float)("0.5") == 0.5
    for kind, text, message in (
        (int, "x", r"^expected an integer, got 'x'$"),
        (float, "x", r"^expected a number, got 'x'$"),
        (int, "0", r"^must be >= 1, got 0$"),
        (float, "nan", r"^must be > 0, got nan$"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            _positive(kind)(text)
