"""A process of a label-sharded run reads the label texts of its share only (issue 42: 10^9 labels' ~34 GB of texts
were read whole by every rank): the readers' shares (`label_text_share`), the share tables they give, and two gloo
ranks of `haste-hf train` that read, save and resume under their shares."""

import gzip
import json

import pytest
import torch
from launch import TESTS, cli_train_arguments, torchrun

from haste_hf.data import load_xmc_dataset
from haste_hf.modeling.label_names import LabelNameTable, first_difference
from haste_hf.xmc_files import XMCFormatError


NAMES = [f"label {i} é" if i % 5 else "" for i in range(23)]


def write_labels(folder, names, text_sparse=False):
    folder.mkdir(exist_ok=True)
    if text_sparse:
        (folder / "trn_X.txt").write_text("a\nb\n")
        (folder / "trn_X_Y.txt").write_text(f"2 {len(names)}\n0:1\n{len(names) - 1}:1\n")
        (folder / "Y.txt").write_text("".join(name + "\n" for name in names), encoding="utf-8")
        return folder
    with gzip.open(folder / "trn.json.gz", "wt") as f:
        f.write(json.dumps({"uid": "0", "title": "a", "content": "", "target_ind": [0, len(names) - 1]}) + "\n")
    with gzip.open(folder / "lbl.json.gz", "wt", encoding="utf-8") as f:
        for i, name in enumerate(names):
            f.write(json.dumps({"uid": str(i), "title": name}, ensure_ascii=False) + "\n")
    return folder


@pytest.mark.parametrize("text_sparse", [False, True])
def test_a_share_of_the_label_texts_holds_its_range_of_all_the_labels(tmp_path, text_sparse):
    folder = write_labels(tmp_path / "data", NAMES, text_sparse)
    counts = []

    def share(count):
        counts.append(count)
        return (8, 15)

    dataset = load_xmc_dataset(folder, cache_dir=tmp_path / "cache", label_text_share=share)
    texts = dataset.label_texts
    assert counts == [23] and dataset.label_count == 23 and len(texts) == 23
    assert isinstance(texts, LabelNameTable) and texts.held == (8, 15)
    assert [texts[i] for i in range(8, 15)] == NAMES[8:15] and texts[-9] == NAMES[14]
    assert sum(data.nbytes for _, data in texts.pieces) == sum(len(n.encode()) for n in NAMES[8:15])
    for outside in (7, 15, 0, 22):
        with pytest.raises(ValueError, match=r"holds the names of labels 8 to 15 of 23 only .* not those of"):
            texts[outside]
    assert first_difference(texts, LabelNameTable.from_strings(NAMES), within=texts.held) is None
    renamed = LabelNameTable.from_strings([*NAMES[:12], "other", *NAMES[13:]])
    assert first_difference(texts, renamed, within=texts.held) == 12
    assert texts.as_label_names()[10] == "LABEL_10" and texts.as_label_names().held == (8, 15)
    # None: every text, as without a share; an empty share: the count alone.
    whole = load_xmc_dataset(folder, cache_dir=tmp_path / "cache", label_text_share=lambda count: None)
    assert list(whole.label_texts) == NAMES
    empty = load_xmc_dataset(folder, cache_dir=tmp_path / "cache", label_text_share=lambda count: (0, 0))
    assert empty.label_count == 23 and empty.label_texts.held == (0, 0)


def test_a_share_is_refused_with_label_points_and_a_malformed_label_file_named(tmp_path):
    folder = write_labels(tmp_path / "data", NAMES)
    with pytest.raises(ValueError, match="add_label_texts=True .* reads them all"):
        load_xmc_dataset(folder, cache_dir=tmp_path / "cache", add_label_texts=True, label_text_share=lambda c: (0, 1))
    with gzip.open(folder / "lbl.json.gz", "at") as f:
        f.write('{"uid": "x", "title": 3}\n')
    with pytest.raises(XMCFormatError, match=r"lbl.json.gz, line 24: missing or non-string `title`"):
        load_xmc_dataset(folder, cache_dir=tmp_path / "cache", label_text_share=lambda count: (0, 5))


@pytest.mark.slow
def test_two_ranks_read_save_and_resume_under_their_shares_of_the_label_texts(tmp_path):
    """Two gloo ranks of `haste-hf train` (30 labels, config.json's names lowered to 10): each rank's data holds the
    texts of its saved range alone (15 labels, not 30); the saved names are every label's; a resumption with the
    same texts goes on, and one whose label 20 (rank 1's) is renamed is refused by both ranks. Rank 1's label layout
    holds no training counts."""
    from haste_hf.modeling.output_shards import OutputShards

    arguments = [*cli_train_arguments(tmp_path), "--use_cpu", "--batch-size", "8"]
    (tmp_path / "arguments.txt").write_text("\n".join(arguments))
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for name in ("trn.json.gz", "tst.json.gz"):
        (renamed / name).write_bytes((tmp_path / "data" / name).read_bytes())
    with gzip.open(renamed / "lbl.json.gz", "wt") as f:
        for label in range(30):
            f.write(json.dumps({"uid": str(label), "title": "renamed" if label == 20 else f"label {label}"}) + "\n")
    torchrun([str(TESTS / "distributed_label_text_shares.py"), str(tmp_path)], tmp_path, timeout=600)
    results = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]
    for rank, result in enumerate(results):
        assert result["codes"] == [0, 0, 1], result["codes"]
        assert result["layout_counts"] == [rank == 0] * 3  # int64 [L]: rank 0's model card alone reads them
        held = (15 * rank, 15 * rank + 15)
        for run, given in enumerate(result["given"]):
            names = [("renamed" if i == 20 and run == 2 else f"label {i}") for i in range(*held)]
            assert given["table"] and given["count"] == 30 and given["held"] == held and given["for_init"] is None
            assert given["names"] == names and given["bytes"] == sum(len(name) for name in names)
    names = OutputShards.open(str(tmp_path / "run")).label_names(30)
    assert [names[i] for i in range(30)] == [f"label {i}" for i in range(30)]


def test_group_and_predict_read_no_label_text(dataset_dir, encoder_dir, tmp_path, monkeypatch):
    """`haste-hf group` (without --label-text-grouping-below) and `haste-hf predict --data` use no label text: they
    count the labels and keep none of the texts (~34 GB at 10^9 labels, in every process of a predict on several
    GPUs); the predictions still name the labels, by the model's names."""
    from launch import data_flags, train_flags

    from haste_hf import data as data_module
    from haste_hf.cli import main

    read, load = [], data_module.load_xmc_dataset

    def recording(*args, **kwargs):
        dataset = load(*args, **kwargs)
        texts = dataset.label_texts
        read.append(texts.held if isinstance(texts, LabelNameTable) else (0, len(texts)))
        return dataset

    monkeypatch.setattr(data_module, "load_xmc_dataset", recording)
    layout = tmp_path / "layout.safetensors"
    group = ["group", *data_flags(dataset_dir), "--encoder", str(encoder_dir), "--group-size", "4"]
    assert main([*group, "--output", str(layout)]) == 0
    model = tmp_path / "model"
    flags = [*train_flags(str(dataset_dir), str(encoder_dir), str(model)), "--layout-file", str(layout)]
    assert main([*flags, "--max-steps", "1", "--no-init-from-label-texts"]) == 0
    predictions = tmp_path / "predictions.jsonl"
    assert main(["predict", "--model", str(model), *data_flags(dataset_dir), "--output", str(predictions)]) == 0
    assert read == [(0, 0), (0, 30), (0, 0)]  # group, train (one process: every name, saved), predict
    first = json.loads(predictions.read_text().splitlines()[0])
    assert first["labels"] == [f"label {i}" for i in first["label_ids"]]
