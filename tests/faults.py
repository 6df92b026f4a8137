"""What the fault tests share: a tiny model of their label count, the state of a folder, and the data and
saved model the command-line cases run on (the `cli_files` fixture)."""

import json
import os
from functools import partial

import pytest
from safetensors.torch import load_file, save_file
from tiny_encoders import planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.modeling.saving import (
    INCOMPLETE_SAVE_FILE,
    STAGING_PREFIX,
)


LABELS = 40


make_model = partial(make_tiny_model, label_count=LABELS)


def folder_state(path):
    """Every file under `path` (hidden ones included) with its bytes."""
    return {
        os.path.relpath(os.path.join(root, name), path): open(os.path.join(root, name), "rb").read()
        for root, _, names in os.walk(path)
        for name in names
    }


def assert_no_leftovers(path):
    leftovers = [name for name in os.listdir(path) if name.startswith(STAGING_PREFIX) or name == INCOMPLETE_SAVE_FILE]
    assert not leftovers, leftovers


CLI_LABELS = 30


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    """A 30-label raw-text dataset, 40- and 20-label ones, a bag-of-words one, a saved 30-label model and texts."""
    import gzip

    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    root = tmp_path_factory.mktemp("cli")

    def dataset(name, labels):
        path = root / name
        path.mkdir()
        for split, rows in (("trn", planted_texts(labels, 40, seed=0)), ("tst", planted_texts(labels, 12, seed=1))):
            with gzip.open(path / f"{split}.json.gz", "wt") as f:
                for i, row in enumerate(rows):
                    f.write(
                        json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]})
                        + "\n"
                    )
        with gzip.open(path / "lbl.json.gz", "wt") as f:
            f.writelines(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n" for label in range(labels))
        return path

    files = {name: dataset(name, labels) for name, labels in (("data", CLI_LABELS), ("data40", 40), ("data20", 20))}
    bow = root / "bow"
    bow.mkdir()
    (bow / "train.txt").write_text("2 5 3\n0,2 1:0.5 4:1.0\n1 0:1.0\n")
    files["bow"] = bow
    model = make_model(label_count=CLI_LABELS, head_label_count=2)
    model.set_label_names([f"label {i}" for i in range(CLI_LABELS)])
    files["model"] = root / "model"
    model.save_pretrained(files["model"])
    tiny_tokenizer(files["model"])
    files["texts"] = root / "texts.txt"
    files["texts"].write_text("w3 w40 w50\nw7 w60\n")
    files["empty"] = root / "empty.txt"
    files["empty"].write_text("")
    return files


def corrupt(folder, name, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors[name])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def poison_encoder_output(model, calls):
    """Makes the encoder's output NaN at the forward passes numbered in `calls`."""
    count = [0]

    def hook(module, inputs, output):
        count[0] += 1
        if count[0] in calls:
            output[0][0, 0, 0] = float("nan")
        return output

    model.encoder.register_forward_hook(hook)


def killed_saves(root, folder, command, points="sample", timeout=900):
    """Runs `command` on copies of the model `folder`, once to its end (`root/runs/new`) and once killed by SIGKILL
    before each chosen event of its saves (`root/runs/killed-K`); see killed_saves.py. Returns the events of the full
    run and how each killed run ended."""
    import sys

    import processes

    out = root / "runs"
    out.mkdir()
    spec = root / "spec.json"
    spec.write_text(json.dumps({"folder": str(folder), "out": str(out), "command": command, "points": points}))
    processes.run(
        [sys.executable, processes.TESTS / "killed_saves.py", spec],
        timeout=timeout,
        env={**processes.child_environment(), "TOKENIZERS_PARALLELISM": "false"},
    )
    return json.loads((out / "events.json").read_text())


def top_labels(folder, batch, k=5):
    """The top-`k` label ids of the model saved in `folder` for `batch`, and its label count."""
    import torch

    from haste_hf import HasteForExtremeClassification

    model = HasteForExtremeClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**batch).logits.topk(k).indices, model.config.label_count


def check_killed_saves(runs, result, old, batch):
    """Every killed run left a folder that loads as the old model (`old`: its `top_labels`) when it was killed before
    its first journal was written, as the new one (`runs/new`) after, with nothing of the switch left."""
    import torch

    new = top_labels(runs / "new", batch)
    assert new[1] != old[1] or not torch.equal(new[0], old[0])  # the two can be told apart
    events = result["events"]
    assert result["killed"], "no point was killed"
    for point, ended in result["killed"].items():
        assert ended == f"signal {9}", (point, events[int(point) - 1], ended)
        folder = runs / f"killed-{point}"
        journal_written = ["move", INCOMPLETE_SAVE_FILE] in events[: int(point) - 1]
        expected = new if journal_written else old
        loaded = top_labels(folder, batch)
        assert loaded[1] == expected[1] and torch.equal(loaded[0], expected[0]), (point, events[int(point) - 1])
        assert not os.path.lexists(folder / INCOMPLETE_SAVE_FILE), point
