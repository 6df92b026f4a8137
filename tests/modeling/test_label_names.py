"""Label names held compactly (haste_hf/modeling/label_names.py): a table of offsets and bytes reads as the list it
replaces; a sharded save writes and reads them per rank (two and three ranks under torchrun); nothing in their files
is trusted; folders whose names are one `label_names.json` still load."""

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from launch import TESTS, torchrun
from safetensors.numpy import save_file
from tiny_haste import make_tiny_model

from haste_hf import HasteForExtremeClassification, xmc_files
from haste_hf.modeling.label_names import (
    LABEL_NAMES_FORMAT,
    LabelNameTable,
    first_difference,
    label_names_file,
    open_name_file,
)
from haste_hf.modeling.output_shards import OUTPUT_SHARDS_INDEX
from haste_hf.training.checkpoints import check_label_names
from haste_hf.training.shard_checkpoints import save_sharded_folder
from haste_hf.training.sharded_output_layer import shard_output_layer_


NAMES = ["alpha", "", "γάμμα", "delta delta", "e"]


def test_a_table_reads_as_the_list_it_replaces():
    table = LabelNameTable.from_strings(NAMES)
    assert len(table) == 5 and list(table) == NAMES and table[2] == "γάμμα" and table[-1] == "e"
    assert table[1:4] == NAMES[1:4] and table == NAMES
    assert NAMES == table  # noqa: SIM300  (a list on the left: the reflected comparison)
    named = table.as_label_names()  # a model's names: the empty one is LABEL_<id>
    assert named[1] == "LABEL_1" and list(named) == ["alpha", "LABEL_1", "γάμμα", "delta delta", "e"]
    with pytest.raises(IndexError):
        table[5]


def test_a_table_from_arrow_takes_its_buffers_chunk_by_chunk():
    chunked = pa.chunked_array([pa.array(NAMES[:2]), pa.array(NAMES[2:]).slice(1), pa.array([], pa.string())])
    table = LabelNameTable.from_arrow(chunked)
    assert list(table) == NAMES[:2] + NAMES[3:] and len(table.pieces) == 3
    assert LabelNameTable.from_arrow(pa.array(NAMES, pa.large_string())) == NAMES
    offsets, data = table.byte_range(1, 3)  # across two pieces
    assert offsets.tolist() == [0, 0, 11] and bytes(data) == b"delta delta"


def test_a_byte_range_within_one_piece_is_a_view_of_it_and_an_empty_range_is_empty():
    table = LabelNameTable.from_arrow(pa.chunked_array([pa.array(NAMES[:2]), pa.array(NAMES[2:])]))
    offsets, data = table.byte_range(2, 4)  # the second piece alone: no copy of a piece of 10^9 names
    assert offsets.tolist() == [0, len("γάμμα".encode()), len("γάμμαdelta delta".encode())]
    assert bytes(data) == "γάμμαdelta delta".encode() and np.shares_memory(data, table.pieces[1][1])
    offsets, data = table.byte_range(3, 3)
    assert offsets.tolist() == [0] and data.size == 0 and data.dtype == np.uint8


def test_first_difference_of_tables_and_lists():
    table = LabelNameTable.from_strings(NAMES)
    assert first_difference(table, LabelNameTable.from_strings(NAMES)) is None
    assert first_difference(table, NAMES[:3] + ["x", "e"]) == 3
    assert first_difference(LabelNameTable.from_strings(NAMES[:3] + ["x", "e"]), table) == 3
    assert first_difference(table, NAMES[:4]) == 4
    assert first_difference(table.as_label_names(), table) == 1  # LABEL_1 against ""


def test_json_label_texts_past_the_threshold_are_a_table(tmp_path, monkeypatch):
    path = tmp_path / "lbl.json"
    path.write_text("".join(json.dumps({"uid": str(i), "title": name}) + "\n" for i, name in enumerate(NAMES)))
    assert isinstance(xmc_files.read_json_label_texts(path), list)
    monkeypatch.setattr(xmc_files, "COMPACT_LABEL_TEXTS_FROM", 5)
    texts = xmc_files.read_json_label_texts(path)
    assert isinstance(texts, LabelNameTable) and list(texts) == NAMES


@pytest.mark.parametrize("processes", [2, 3])
def test_each_rank_writes_and_reads_only_its_share_of_the_names(tmp_path, processes):
    torchrun([str(TESTS / "distributed_label_names.py"), str(tmp_path)], tmp_path, processes=processes, timeout=300)
    from distributed_label_names import LABELS
    from distributed_label_names import NAMES as LONG_NAMES

    expected = [name or f"LABEL_{label_id}" for label_id, name in enumerate(LONG_NAMES)]
    first = 0
    for rank in range(processes):
        result = torch.load(tmp_path / f"rank-{rank}.pt")
        count = result["count"]
        assert result["first"] == first and 0 < count < LABELS  # its range alone
        assert result["bytes"] == "".join(LONG_NAMES[first : first + count]).encode()
        assert result["loaded_is_table"] and result["loaded"] == expected and result["config_name"] == "LABEL_7"
        first += count
    assert first == LABELS
    index = json.loads((tmp_path / "model" / OUTPUT_SHARDS_INDEX).read_text())
    assert [entry["file"] for entry in index["label_names"]["files"]] == [
        label_names_file(rank, processes) for rank in range(processes)
    ]


def saved_folder(folder):
    model = make_tiny_model(5, head_label_count=1, training=False)
    model.set_label_names(NAMES)
    shard_output_layer_(model)
    save_sharded_folder(model, folder)
    return folder


def write_names(path, offsets, data, first="0", format=LABEL_NAMES_FORMAT):
    save_file(
        {"offsets": np.asarray(offsets, dtype=np.int64), "bytes": np.frombuffer(data, dtype=np.uint8)},
        str(path),
        {"format": format, "first_label": first},
    )


@pytest.mark.parametrize(
    "offsets, data, first, count, message",
    [
        ([0, 2, 1, 3], b"abc", "0", 3, "decrease"),
        ([0, 1, 2], b"abc", "0", 2, "not 0 to 3"),
        ([0, 1, 3], b"abc", "0", 3, "shape"),
        ([0, 1, 3], b"abc", "4", 2, "labels from 0"),
    ],
)
def test_a_names_file_is_checked_on_opening(tmp_path, offsets, data, first, count, message):
    write_names(tmp_path / "names.safetensors", offsets, data, first)
    with pytest.raises(ValueError, match=message):
        open_name_file(str(tmp_path / "names.safetensors"), 0, count)


def test_a_name_that_is_not_utf8_is_refused_when_read(tmp_path):
    write_names(tmp_path / "names.safetensors", [0, 1, 3], b"a\xff\xfe")
    table = LabelNameTable([open_name_file(str(tmp_path / "names.safetensors"), 0, 2)], source="names.safetensors")
    assert table[0] == "a"
    with pytest.raises(ValueError, match="label 1 is not UTF-8"):
        table[1]


def test_an_index_naming_a_names_file_outside_the_folder_is_refused(tmp_path, one_process_group):
    folder = saved_folder(tmp_path / "model")
    index = json.loads((folder / OUTPUT_SHARDS_INDEX).read_text())
    index["label_names"]["files"][0]["file"] = "../names.safetensors"
    (folder / OUTPUT_SHARDS_INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="not a safetensors file beside it"):
        HasteForExtremeClassification.from_pretrained(folder)


def test_a_sharded_folder_whose_names_are_one_json_still_loads(tmp_path, one_process_group):
    """Folders saved before the names had files of their own: the index lists none, `label_names.json` holds them."""
    folder = saved_folder(tmp_path / "model")
    index = json.loads((folder / OUTPUT_SHARDS_INDEX).read_text())
    del index["label_names"]
    (folder / OUTPUT_SHARDS_INDEX).write_text(json.dumps(index))
    (folder / label_names_file(0, 1)).unlink()
    (folder / "label_names.json").write_text(json.dumps(["one", "two", "three", "four", "five"]))
    assert HasteForExtremeClassification.from_pretrained(folder).label_names == ["one", "two", "three", "four", "five"]
    check_label_names(str(folder), ["one", "two", "three", "four", "five"])


def test_a_resume_under_other_names_is_refused_from_the_names_files(tmp_path, one_process_group):
    folder = saved_folder(tmp_path / "model")
    loaded = HasteForExtremeClassification.from_pretrained(folder)
    assert isinstance(loaded.label_names, LabelNameTable)
    check_label_names(str(folder), loaded.label_names)
    check_label_names(str(folder), ["alpha", "LABEL_1", "γάμμα", "delta delta", "e"])
    with pytest.raises(ValueError, match="label 3 is 'delta delta' there and 'other' in this run"):
        check_label_names(str(folder), ["alpha", "LABEL_1", "γάμμα", "other", "e"])


@pytest.mark.slow
def test_a_cli_run_on_two_processes_keeps_its_names_compact_and_links_its_last_checkpoint(tmp_path):
    """`haste-hf train` on two processes with the label texts a table (as past 20M labels), a weights-only checkpoint
    at its last step: the final folder's shards and names files are the checkpoint's (hard links), the names load as a
    table, and `haste-hf predict` on two processes names its labels from them."""
    import os

    from launch import cli_train_arguments

    from haste_hf.modeling.output_shards import output_shard_file

    run = tmp_path / "run"
    arguments = [*cli_train_arguments(tmp_path), "--use_cpu", "--batch-size", "8", "--max-steps", "4"]
    arguments += ["--save-strategy", "steps", "--save-steps", "4", "--save-only-model", "true", "--output-dir", run]
    torchrun([TESTS / "distributed_cli_tables.py", *arguments], tmp_path, timeout=420)
    for rank in range(2):
        for name in (output_shard_file(rank, 2), label_names_file(rank, 2)):
            assert os.stat(run / name).st_ino == os.stat(run / "checkpoint-4" / name).st_ino, name
    assert not (run / "label_names.json").exists()
    loaded = HasteForExtremeClassification.from_pretrained(run)
    assert isinstance(loaded.label_names, LabelNameTable) and list(loaded.label_names) == [
        f"label {i}" for i in range(30)
    ]
    predict = ["-m", "haste_hf.cli", "predict", "--model", run, "--data", tmp_path / "data", "-k", "3"]
    torchrun([*predict, "--output", tmp_path / "top.jsonl"], tmp_path, timeout=300)
    records = [json.loads(line) for line in (tmp_path / "top.jsonl").read_text().splitlines()]
    assert len(records) == 41
    assert all(record["labels"] == [f"label {i}" for i in record["label_ids"]] for record in records)


def test_a_sharded_folder_exports_its_names_as_one_json(tmp_path, one_process_group):
    """An export reads the model whole and writes `label_names.json` for onnxruntime: the compact table as a list."""
    from tiny_encoders import tiny_tokenizer

    from haste_hf.export import export_onnx

    folder = saved_folder(tmp_path / "model")
    tiny_tokenizer(folder)
    export_onnx(folder, tmp_path / "export", top_k=2)
    assert json.loads((tmp_path / "export" / "label_names.json").read_text()) == [
        "alpha",
        "LABEL_1",
        "γάμμα",
        "delta delta",
        "e",
    ]
