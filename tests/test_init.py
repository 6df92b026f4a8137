"""The package's top level: the public API, its training half imported on first use."""

import subprocess
import sys

import pytest

import haste_hf


def test_import_leaves_the_training_api_unimported():
    code = "import sys, haste_hf; print(sorted(m for m in sys.modules if m.startswith('haste_hf.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for module in ("trainer", "training_args", "callbacks", "recipe", "label_plan", "grouping", "data", "metrics"):
        assert f"'haste_hf.{module}'" not in loaded, module


@pytest.mark.parametrize("name", haste_hf.__all__)
def test_every_public_name_resolves(name):
    assert getattr(haste_hf, name) is not None
    assert name in dir(haste_hf)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'HasteTrainr'"):
        haste_hf.HasteTrainr  # noqa: B018
