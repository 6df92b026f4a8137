"""A load that overlaps saves of the same folder gets one whole save (weights, label names, layout, tokenizer) or a
clear error, never one save's weights with another's names: a saver process against loads in this one."""

import sys
import time

import processes
import pytest
import torch
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import AutoTokenizer

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import read_one_save, save_trained_folder


LABELS = 12
SAVING_SECONDS = 20


def make_source(folder, seed: int, prefix: str, max_length: int):
    """A saved model of its own weights, label order, names and tokenizer length; its state."""
    model = make_tiny_model(LABELS, seed=seed, shuffle_labels=True)
    model.set_label_names([f"{prefix}{i}" for i in range(LABELS)])
    tokenizer = tiny_tokenizer(folder.parent / f"tokenizer-{prefix}")
    tokenizer.model_max_length = max_length
    save_trained_folder(folder, model, tokenizer)
    return {"names": model.label_names, "state": model.state_dict(), "max_length": max_length}


def matching_sources(sources, model, tokenizer=None) -> set:
    """The (source, part) pairs that what was loaded matches, on the tensors where the two sources differ."""
    a, b = (source["state"] for source in sources.values())
    differing = [key for key in a if not torch.equal(a[key], b[key])]
    assert "output_layer.output_labels" in differing and len(differing) > 1
    found = set()
    loaded = model.state_dict()
    for name, source in sources.items():
        for key in differing:
            if torch.equal(loaded[key], source["state"][key]):
                found.add((name, "layout" if key == "output_layer.output_labels" else "weights"))
        if model.label_names == source["names"]:
            found.add((name, "names"))
        if tokenizer is not None and tokenizer.model_max_length == source["max_length"]:
            found.add((name, "tokenizer"))
    return found


def test_loads_during_saves_get_one_save_or_an_error(tmp_path):
    sources = {"a": make_source(tmp_path / "a", 0, "a", 16), "b": make_source(tmp_path / "b", 1, "b", 24)}
    target = tmp_path / "target"
    save_trained_folder(
        target,
        HasteForExtremeClassification.from_pretrained(tmp_path / "a"),
        AutoTokenizer.from_pretrained(tmp_path / "a"),
    )
    saver = processes.start(
        [
            sys.executable,
            processes.TESTS / "concurrent_saver.py",
            tmp_path / "a",
            tmp_path / "b",
            target,
            str(SAVING_SECONDS),
        ],
        env=processes.child_environment(),
    )
    whole, refused, mixed = 0, 0, []
    try:
        deadline = time.monotonic() + SAVING_SECONDS + 120
        while saver.poll() is None and time.monotonic() < deadline:
            with_tokenizer = (whole + refused) % 2 == 1
            try:
                if with_tokenizer:
                    model, tokenizer = read_one_save(
                        target,
                        lambda: (
                            HasteForExtremeClassification.from_pretrained(target),
                            AutoTokenizer.from_pretrained(target),
                        ),
                    )
                else:
                    model, tokenizer = HasteForExtremeClassification.from_pretrained(target), None
            except OSError as error:
                assert str(target) in str(error) and "\n" not in str(error)
                refused += 1
                continue
            parts = matching_sources(sources, model, tokenizer)
            origins = {name for name, _ in parts}
            expected_parts = 4 if with_tokenizer else 3
            if len(origins) != 1 or len(parts) != expected_parts:
                mixed.append(sorted(parts))
            else:
                whole += 1
        assert saver.wait(timeout=60) == 0
    finally:
        processes.kill_group(saver.pid)
        saver.wait()
    assert not mixed, f"{len(mixed)} loads mixed two saves (and {whole} whole, {refused} refused): {mixed[:3]}"
    assert whole >= 3, f"only {whole} whole loads ({refused} refused)"


def test_a_save_that_failed_midway_is_finished_at_once_not_waited_for(tmp_path, monkeypatch):
    """A save that failed while its files moved in (its process lives on, the folder unlocked) is finished by the
    next load at once, which then loads it whole."""
    import os

    make_tiny_model(LABELS, seed=0).save_pretrained(tmp_path)
    original, calls = os.replace, []

    def fail_on_the_second_file(source, destination):
        calls.append(destination)
        if len(calls) == 3:  # the journal, one file, then this one
            raise OSError(28, "No space left on device")
        original(source, destination)

    monkeypatch.setattr(os, "replace", fail_on_the_second_file)
    new = make_tiny_model(LABELS, seed=1)
    with pytest.raises(OSError, match="No space left"):
        new.save_pretrained(tmp_path)
    monkeypatch.setattr(os, "replace", original)
    started = time.monotonic()
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path)
    # A load waits up to 60 s for a save that is switching its files in (`read_one_save`): half of that tells a wait
    # from a slow load on a loaded 2-core machine.
    assert time.monotonic() - started < 30
    assert torch.equal(loaded.output_layer.tail.weight, new.output_layer.tail.weight)
