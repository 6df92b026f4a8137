"""An export over a previous one (`haste-hf export --overwrite`), killed by SIGKILL at points of its switch, leaves a
folder that `OnnxClassifier` serves as the old export or as the new one (same top-k as one of them), never refuses
and never mixes; the next export into it runs."""

import numpy as np
from faults import killed_saves
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.export import export_onnx
from haste_hf.modeling.saving import INCOMPLETE_SAVE_FILE
from haste_hf.onnx_serving import OnnxClassifier


LABELS = 30


def saved_model(folder, seed):
    model = make_tiny_model(LABELS, head_label_count=4, seed=seed, shuffle_labels=True, training=False)
    model.set_label_names([f"tag {seed} {i}" for i in range(LABELS)])
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder


def served(folder, batch):
    classifier = OnnxClassifier(folder)
    label_ids, scores = classifier.top_k(*batch, k=5)
    return label_ids, scores, classifier.label_names


def test_an_export_killed_over_a_previous_one_serves_the_old_or_the_new(tmp_path, layout="single"):
    old_model, new_model = saved_model(tmp_path / "old-model", 1), saved_model(tmp_path / "new-model", 2)
    folder = tmp_path / "export"
    split = ["--split-output-layer"] if layout == "split" else []
    export_onnx(str(old_model), folder, layout=layout)
    generator = np.random.default_rng(0)
    batch = (generator.integers(4, 90, (3, 9)), np.ones((3, 9), dtype=np.int64))
    old = served(folder, batch)
    command = ["cli", "export", "--model", str(new_model), "--output", "{folder}", "--overwrite", *split]
    result = killed_saves(tmp_path, folder, command)
    runs = tmp_path / "runs"
    new = served(runs / "new", batch)
    assert old[2] != new[2] and not np.array_equal(old[1], new[1])  # the two can be told apart
    events = result["events"]
    assert sum(kind == "move" for kind, _ in events) >= 6, events
    for point, ended in result["killed"].items():
        assert ended == "signal 9", (point, events[int(point) - 1], ended)
        killed = runs / f"killed-{point}"
        expected = new if ["move", INCOMPLETE_SAVE_FILE] in events[: int(point) - 1] else old
        got = served(killed, batch)
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]), point
        assert got[2] == expected[2], point
    # The next export into a folder left mid-switch finishes the stopped switch, then writes its own.
    moved = [p for p in result["killed"] if events[int(p) - 1][0] == "move" and events[int(p) - 1][1][0] != "."]
    again = runs / f"killed-{moved[len(moved) // 2]}"
    assert (again / INCOMPLETE_SAVE_FILE).exists()
    export_onnx(str(old_model), again, layout=layout, overwrite=True)
    assert not (again / INCOMPLETE_SAVE_FILE).exists()
    got = served(again, batch)
    assert np.array_equal(got[0], old[0]) and got[2] == old[2]
