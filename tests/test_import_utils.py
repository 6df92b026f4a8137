"""The availability checks of optional packages: whether each can be imported, asked at each call."""

import importlib.util

import pytest

from haste_hf import import_utils


@pytest.mark.parametrize(
    "check, package",
    [
        (import_utils.is_peft_available, "peft"),
        (import_utils.is_triton_available, "triton"),
    ],
)
def test_each_check_answers_whether_its_package_can_be_imported(check, package, monkeypatch):
    assert check() is (importlib.util.find_spec(package) is not None)
    asked = []
    for found in (None, object()):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, found=found: asked.append(name) or found)
        assert check() is (found is not None)
    assert asked == [package, package]


def test_missing_packages_lists_the_ones_not_installed_in_order(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name.startswith("no") else object())
    assert import_utils.missing_packages(["onnx", "nothing", "torch", "nowhere"]) == ["nothing", "nowhere"]
