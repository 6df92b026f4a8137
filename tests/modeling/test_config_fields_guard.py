"""A config.json's `format_version` and keys are checked: a version that is not an integer in the known range, or a
typo of a HASTE field (`group_sise`, which transformers would keep as an unused attribute), is refused in one line
naming the key; other unknown keys load with a warning naming the nearest known one; transformers' own keys pass."""

import json
import re

import pytest
from tiny_encoders import tiny_encoder_config
from tiny_haste import make_tiny_model
from transformers.utils import logging

from haste_hf import HASTE_FORMAT_VERSION, HasteConfig, HasteForExtremeClassification


def config(**fields) -> HasteConfig:
    return HasteConfig(encoder=tiny_encoder_config("bert"), label_count=30, head_label_count=2, fan_in=8, **fields)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("config-guard") / "model"
    make_tiny_model(label_count=30, head_label_count=2).save_pretrained(folder)
    return folder


def edited(saved, tmp_path, **changes):
    """A copy of the saved model's config.json with `changes` (None: key removed) and its weights linked."""
    folder = tmp_path / "edited"
    folder.mkdir()
    values = json.loads((saved / "config.json").read_text())
    values.update(changes)
    (folder / "config.json").write_text(json.dumps(values))
    (folder / "model.safetensors").symlink_to(saved / "model.safetensors")
    return folder


@pytest.mark.parametrize("version", [-1, 0, True, False, "4", "3", None, 3.0, [3]])
def test_a_format_version_that_is_no_known_integer_is_refused_in_one_line(version, saved, tmp_path):
    message = rf"`format_version` must be an integer in \[1, {HASTE_FORMAT_VERSION}\], got " + re.escape(repr(version))
    with pytest.raises(ValueError, match=message) as refused:
        config(format_version=version)
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match=message):
        HasteForExtremeClassification.from_pretrained(edited(saved, tmp_path, format_version=version))


def test_known_format_versions_load_and_a_newer_one_asks_for_an_upgrade(saved, tmp_path):
    for version in range(1, HASTE_FORMAT_VERSION + 1):
        assert config(format_version=version).format_version == version
    with pytest.raises(ValueError, match="upgrade haste_hf"):
        config(format_version=HASTE_FORMAT_VERSION + 1)


@pytest.mark.parametrize(
    "typo, field",
    [
        ("group_sise", "group_size"),
        ("fanin", "fan_in"),
        ("head_label_cont", "head_label_count"),
        ("normalise", "normalize"),
    ],
)
def test_a_typo_of_a_haste_field_is_refused_naming_the_field(typo, field, saved, tmp_path):
    message = f"`{typo}` is not a field; did you mean `{field}`?"
    with pytest.raises(ValueError, match=message):
        HasteForExtremeClassification.from_pretrained(edited(saved, tmp_path, **{typo: 8}))
    with pytest.raises(ValueError, match=message):
        config(**{typo: 8})


def test_other_unknown_keys_warn_and_transformers_keys_pass(saved, tmp_path, caplog):
    logging.get_logger("transformers").propagate = True  # transformers' loggers stop at its own handler otherwise
    try:
        with caplog.at_level("WARNING"):
            model = HasteForExtremeClassification.from_pretrained(
                edited(
                    saved,
                    tmp_path,
                    my_note="trained on Tuesday",
                    torch_dtype="float32",
                    output_hidden_states=False,
                    use_cache=False,  # written by transformers when a training turns activation checkpointing on
                )
            )
    finally:
        logging.get_logger("transformers").propagate = False
    assert model.config.label_count == 30
    warned = {record.getMessage() for record in caplog.records if "is not a field" in record.getMessage()}
    assert len(warned) == 1 and "`my_note`" in warned.pop(), warned
    caplog.clear()
    HasteForExtremeClassification.from_pretrained(saved)  # a config as saved: no warning
    assert not [record for record in caplog.records if "is not a field" in record.getMessage()]
