"""`benchmarks/unseen_labels.py` at tiny scale on the CPU: the held-out split, both trainings through `haste-hf train`,
the labels added from text and examples, the baselines and the report."""

import gzip
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from benchmark_scripts import BENCHMARKS, load_benchmark


unseen_labels = load_benchmark("unseen_labels")


def test_held_out_labels_are_stratified_by_frequency():
    # Label l appears 100 - l times: every run of 10 neighbouring frequencies gives one label.
    rows = [{"target_ind": [label]} for label in range(100) for _ in range(100 - label)]
    held_out = unseen_labels.held_out_labels(rows, 100, seed=0)
    assert held_out.size == 10 and sorted({int(label) // 10 for label in held_out}) == list(range(10))
    assert not np.array_equal(held_out, unseen_labels.held_out_labels(rows, 100, seed=1))


def test_the_held_out_dataset_drops_the_labels_and_the_points_left_without_any(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    unseen_labels.write_rows(source / "lbl.json.gz", [{"uid": str(i), "title": f"label {i}"} for i in range(4)])
    points = [[0, 2], [2], [1, 3], [3]]
    for name in ("trn.json.gz", "tst.json.gz"):
        unseen_labels.write_rows(
            source / name, [{"uid": str(i), "title": "t", "content": "", "target_ind": p} for i, p in enumerate(points)]
        )
    unseen_labels.write_held_out_dataset(source, tmp_path / "target", np.array([2]))
    assert [row["title"] for row in unseen_labels.read_rows(tmp_path / "target" / "lbl.json.gz")] == [
        "label 0",
        "label 1",
        "label 3",
    ]
    kept = unseen_labels.read_rows(tmp_path / "target" / "trn.json.gz")
    assert [(row["uid"], row["target_ind"]) for row in kept] == [("0", [0]), ("2", [1, 2]), ("3", [2])]


def test_ranked_metrics_count_hits_per_point():
    top = np.array([[1, 2, 3, 4, 5], [7, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    metrics = unseen_labels.ranked_metrics(top, [{1, 9}, {9}, set()], "held_")
    assert metrics["held_points"] == 2
    assert metrics["held_P@1"] == pytest.approx(0.5) and metrics["held_R@5"] == pytest.approx(0.25)


@pytest.fixture
def tiny_data(tmp_path, dataset_dir):
    """The 30-label planted dataset of conftest, whose label texts name each label's planted word."""
    root = tmp_path / "data"
    (root / "tiny").mkdir(parents=True)
    for name in ("trn.json.gz", "tst.json.gz"):
        (root / "tiny" / name).write_bytes((dataset_dir / name).read_bytes())
    with gzip.open(root / "tiny" / "lbl.json.gz", "wt") as f:
        for label in range(30):
            f.write(json.dumps({"uid": str(label), "title": f"w{label}"}) + "\n")
    return root


def test_a_tiny_study_on_the_cpu(tmp_path, tiny_data, encoder_dir):
    out = tmp_path / "out"
    argv = [sys.executable, str(BENCHMARKS / "unseen_labels.py"), "--data-root", str(tiny_data), "--datasets", "tiny"]
    argv += ["--encoder", str(encoder_dir), "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    argv += ["--eval-batch-size", "16", "--budget-s", "500", "--seeds", "0", "1", "--fit-steps", "5"]
    argv += ["--extra", "--max-steps 4 --max-length 16 --eval-batch-size 16 --fan-in 8 --group-size 4"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=540)
    finally:  # the driver and its workers, whatever happened
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, output.decode()[-3000:]

    for seed in (0, 1):
        results = {}
        for job in unseen_labels.JOBS:
            results.update(json.loads((out / "runs" / f"tiny__{job}__s{seed}.json").read_text()))
        assert results["held_out_labels"] == 3 and results["label_count"] == 30
        for name in ("cosine", "before", *unseen_labels.ADDITIONS, "ceiling"):
            assert name in results
        for name in (*unseen_labels.ADDITIONS, "ceiling"):
            assert 0 <= results[name]["held_R@5"] <= 1 and results[name]["held_points"] > 0
        # The added labels leave every other label's scores as they were: the other labels rank exactly as before.
        for name in unseen_labels.ADDITIONS:
            assert {k: v for k, v in results[name].items() if k.startswith("other_")} == {
                k: v for k, v in results["before"].items() if k.startswith("other_")
            }
            calibration = results[name]["calibration"]
            # Every (test point, label) pair lands in one score bin; the true ones are the test split's labels.
            assert sum(map(sum, calibration["pairs"])) % 30 == 0 and sum(map(sum, calibration["pairs"])) > 0
            assert sum(map(sum, calibration["true_pairs"])) == sum(map(sum, calibration["true_count"]))
    table = (out / "table.md").read_text()
    assert "| text+5 |" in table and "| ceiling |" in table and "of the ceiling's (target >= 50%)" in table
    assert "never worse than before adding" in table and "| score | old pairs |" in table and "±" in table
