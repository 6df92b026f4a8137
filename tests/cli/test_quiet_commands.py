"""The commands a user runs first print no warning the user cannot act on: a train, an add-labels, a predict, and a
load with its pipeline. Every Python warning and every logged warning of each is collected; one not listed in
`EXPECTED` (one, of this tiny run only) fails the test, so a new one is seen where it appears."""

import json
import logging
import warnings

import pytest
from transformers import AutoModel, pipeline

from haste_hf.cli import main


# (step, a warning's text, why it may be shown).
EXPECTED: list[tuple[str, str, str]] = [
    (
        "train",
        "mtime may not be reliable on this filesystem, falling back to numerical ordering",
        "transformers' checkpoint rotation, where a run's checkpoints were saved within a second of each other: this "
        "tiny run's are; a real run's are minutes apart",
    ),
]


@pytest.fixture
def collected(caplog):
    """Runs a step, and returns the warnings it printed: Python warnings, and records of WARNING or above."""

    def run(step):
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            result = step()
        said = [f"{warning.category.__name__}: {warning.message}" for warning in caught]
        said += [
            f"{record.name}: {record.getMessage()}" for record in caplog.records if record.levelno >= logging.WARNING
        ]
        return result, said

    return run


def unexpected(step: str, said: list[str]) -> list[str]:
    allowed = [start for name, start, _ in EXPECTED if name == step]
    return [line for line in said if not any(start in line for start in allowed)]


@pytest.mark.slow
def test_train_add_labels_predict_and_load_print_no_warning(tmp_path, dataset_dir, encoder_dir, collected):
    model = tmp_path / "model"
    train = ["train", "--data", str(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(model)]
    train += ["--max-steps", "3", "--group-size", "4", "--fan-in", "8", "--max-length", "16"]
    code, said = collected(lambda: main(train))
    assert code == 0 and unexpected("train", said) == []

    (tmp_path / "new.json").write_text(json.dumps([{"name": "new", "text": "w90 w91"}]))
    added = tmp_path / "added"
    add = ["add-labels", "--model", str(model), "--labels", str(tmp_path / "new.json")]
    add += ["--negatives", str(dataset_dir), "--output-dir", str(added)]
    code, said = collected(lambda: main(add))
    assert code == 0 and unexpected("add-labels", said) == []

    (tmp_path / "texts.txt").write_text("w1 w2 w3\nw4 w90\n")
    predict = ["predict", "--model", str(added), "--input", str(tmp_path / "texts.txt")]
    code, said = collected(lambda: main([*predict, "--output", str(tmp_path / "top.jsonl")]))
    assert code == 0 and unexpected("predict", said) == []

    def load():
        AutoModel.from_pretrained(added)
        return pipeline("text-classification", model=str(added), top_k=2)(["w1 w2", "w90"])

    results, said = collected(load)
    assert len(results) == 2 and unexpected("load", said) == []
