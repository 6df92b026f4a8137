"""`train` keeps the training counts of the labels beside the model (`training_label_counts.safetensors`), and
`haste-hf evaluate` takes the propensities from them instead of reading the training file again, where they
counted the dataset's training files as they are; a file that is not what `train` writes is refused (issue 37)."""

import json
import os
import shutil

import numpy as np
import pytest
from launch import data_flags
from safetensors.numpy import load_file, save_file

from haste_hf import data as data_module
from haste_hf.cli import main
from haste_hf.evaluation import TRAINING_COUNTS_FILE, saved_training_counts
from haste_hf.recipe import load_dataset


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dataset_dir, encoder_dir):
    output = tmp_path_factory.mktemp("model")
    arguments = [
        "train", *data_flags(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(output),
        "--max-steps", "3", "--batch-size", "16", "--group-size", "4", "--fan-in", "8", "--grouping", "random",
        "--propensity-a", "0.5", "--propensity-b", "0.4",
    ]  # fmt: skip
    assert main(arguments) == 0
    return output


@pytest.fixture
def splits_read(monkeypatch):
    """The splits each read of a JSON dataset reads, in order."""
    read = []
    original = data_module.read_json_split

    def recording(*args, **kwargs):
        read.append(kwargs["split"])
        return original(*args, **kwargs)

    monkeypatch.setattr(data_module, "read_json_split", recording)
    return read


def test_train_keeps_the_training_counts_the_read_counted(trained, dataset_dir):
    dataset = load_dataset(str(dataset_dir))
    counts = load_file(trained / TRAINING_COUNTS_FILE)["label_counts"]
    assert counts.dtype == np.int32 and counts.tolist() == dataset.train_label_frequencies.tolist()
    assert saved_training_counts(trained, dataset.label_count, str(dataset_dir))[1] == dataset.num_train_points


def test_evaluate_reads_the_test_split_alone_with_the_same_metrics(trained, dataset_dir, tmp_path, splits_read):
    metrics = tmp_path / "metrics.json"
    assert main(["evaluate", "--model", str(trained), "--data", str(dataset_dir), "--output", str(metrics)]) == 0
    assert splits_read == ["test"]
    assert json.loads(metrics.read_text()) == json.loads((trained / "test_metrics.json").read_text())
    # Without the file (a folder of an earlier release): the training file is read, the metrics the same.
    folder = tmp_path / "without"
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoint-*", TRAINING_COUNTS_FILE))
    splits_read.clear()
    assert main(["evaluate", "--model", str(folder), "--data", str(dataset_dir), "--output", str(metrics)]) == 0
    assert splits_read == ["train", "test"]
    assert json.loads(metrics.read_text()) == json.loads((trained / "test_metrics.json").read_text())


def test_predict_of_a_split_reads_that_split_alone(trained, dataset_dir, tmp_path, splits_read):
    output = tmp_path / "top.jsonl"
    assert main(["predict", "--model", str(trained), "--data", str(dataset_dir), "--output", str(output)]) == 0
    assert splits_read == ["test"] and len(output.read_text().splitlines()) == 40


def test_counts_of_other_training_files_are_not_used(trained, dataset_dir, tmp_path, splits_read):
    # The same dataset copied elsewhere, then its training file changed: the counts describe neither.
    copy = tmp_path / "data"
    shutil.copytree(dataset_dir, copy)
    label_count = load_dataset(str(copy)).label_count
    assert saved_training_counts(trained, label_count, str(copy)) is None
    assert saved_training_counts(trained, label_count, str(dataset_dir)) is not None
    stat = os.stat(dataset_dir / "trn.json.gz")
    try:
        os.utime(dataset_dir / "trn.json.gz", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert saved_training_counts(trained, label_count, str(dataset_dir)) is None
        splits_read.clear()
        assert main(["evaluate", "--model", str(trained), "--data", str(dataset_dir)]) == 0
        assert splits_read == ["train", "test"]
    finally:
        os.utime(dataset_dir / "trn.json.gz", ns=(stat.st_atime_ns, stat.st_mtime_ns))


def rewritten(trained, tmp_path, tensors=None, metadata=None, raw=None):
    """A copy of the trained folder whose counts file holds `tensors` and `metadata` (default: its own), or `raw`."""
    folder = tmp_path / "folder"
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    path = folder / TRAINING_COUNTS_FILE
    if raw is not None:
        path.write_bytes(raw)
        return folder
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        own_metadata = handle.metadata()
    own = load_file(path)
    save_file(tensors if tensors is not None else own, str(path), {**own_metadata, **(metadata or {})})
    return folder


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(raw=b"not a safetensors file"), "is not a safetensors file"),
        (dict(metadata={"version": "0"}), "is not a file of training counts"),
        (dict(metadata={"train_points": "-3"}), "is not a file of training counts"),
        (dict(tensors={"other": np.zeros(30, np.int32)}), "is not a file of training counts"),
        (dict(tensors={"label_counts": np.zeros(30, np.int64)}), "dtype int64 and shape \\[30\\], expected int32"),
        (dict(tensors={"label_counts": np.zeros((2, 15), np.int32)}), "shape \\[2, 15\\], expected int32"),
        (dict(tensors={"label_counts": np.full(30, -1, np.int32)}), "outside \\[0, "),
        (dict(tensors={"label_counts": np.full(30, 10**6, np.int32)}), "outside \\[0, "),
    ],
)
def test_a_counts_file_not_as_train_writes_it_is_refused(trained, dataset_dir, tmp_path, capsys, change, message):
    folder = rewritten(trained, tmp_path, **change)
    with pytest.raises(ValueError, match=message):
        saved_training_counts(folder, 30, str(dataset_dir))
    assert main(["evaluate", "--model", str(folder), "--data", str(dataset_dir)]) == 1
    error = capsys.readouterr().err
    assert TRAINING_COUNTS_FILE in error and "delete the file" in error


def test_counts_of_another_label_count_are_not_used(trained, dataset_dir, tmp_path):
    # `add-labels --overwrite-output-dir` into the trained folder leaves the file of the labels before: not used.
    folder = rewritten(trained, tmp_path)
    assert saved_training_counts(folder, 30, str(dataset_dir)) is not None
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"name": "new", "text": "w1 w2"}]))
    argv = ["add-labels", "--model", str(folder), "--labels", str(labels), "--output-dir", str(folder)]
    assert main([*argv, "--overwrite-output-dir", "--max-length", "6"]) == 0
    assert (folder / TRAINING_COUNTS_FILE).is_file() and saved_training_counts(folder, 31, str(dataset_dir)) is None
