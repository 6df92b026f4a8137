"""A label-sharded run's folders (haste_hf/training/shard_checkpoints.py, haste_hf/modeling/output_shards.py): each
rank writes and reads its own rows of the output layer; one process loads the folder whole; nothing in the index is
trusted. The save and load run on a gloo group of one process here, on two and three under torchrun below."""

import json
import os
import shutil

import pytest
import torch
from launch import TESTS, torchrun
from safetensors.torch import load_file, save_file
from tiny_haste import make_tiny_model

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.label_names import LabelNameTable, label_names_file
from haste_hf.modeling.output_shards import OUTPUT_SHARDS_INDEX, OutputShards, output_shard_file, row_range
from haste_hf.modeling.saving import SAVE_GENERATION_FILE, checkpoint_problem
from haste_hf.training import shard_checkpoints
from haste_hf.training.shard_checkpoints import load_folder_rows_, save_sharded_folder
from haste_hf.training.sharded_output_layer import shard_output_layer_


def sharded_save(folder, output_dtype=torch.float32):
    """A tiny model (head 5 rows, tail 9 groups of 4; the head and tail in `output_dtype`) saved by a one-rank
    sharded layer; its whole state."""
    model = make_tiny_model(40, head_label_count=5, training=False)
    model.output_layer.head.to(output_dtype), model.output_layer.tail.to(output_dtype)
    model.set_label_names([f"label {label_id}" for label_id in range(40)])
    whole = {name: value.clone() for name, value in model.state_dict().items()}
    shard_output_layer_(model)
    save_sharded_folder(model, folder)
    return model, whole


def split_in_two(folder, head_rows=((0, 3), (3, 5)), tail_groups=((0, 5), (5, 9))):
    """Rewrites the one shard of `folder` as two (the files of a two-rank save)."""
    index = json.loads((folder / OUTPUT_SHARDS_INDEX).read_text())
    single = folder / index["shards"][0]["file"]
    tensors = load_file(single)
    single.unlink()
    index["shards"] = []
    for rank, (head, tail) in enumerate(zip(head_rows, tail_groups)):
        rows = {name: row_range(name, head, tail, index["group_size"]) for name in tensors}
        part = {name: value[slice(*rows[name])].contiguous() for name, value in tensors.items()}
        save_file(part, folder / output_shard_file(rank, 2))
        index["shards"].append({"file": output_shard_file(rank, 2), "head_rows": list(head), "tail_groups": list(tail)})
    (folder / OUTPUT_SHARDS_INDEX).write_text(json.dumps(index))
    return index


def assert_state(model, expected):
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


def test_a_sharded_save_is_one_switch_and_loads_whole_in_one_process(tmp_path, one_process_group, capfd):
    model, whole = sharded_save(tmp_path / "model")
    files = set(os.listdir(tmp_path / "model"))
    assert {OUTPUT_SHARDS_INDEX, output_shard_file(0, 1), "model.safetensors", label_names_file(0, 1)} <= files
    assert "label_names.json" not in files  # the names are in files of one rank each, not one list
    assert not any(name.startswith(".haste-staging") for name in files) and SAVE_GENERATION_FILE in files
    assert "output_layer.tail.weight" not in load_file(tmp_path / "model" / "model.safetensors")
    # The label ids too are in the shards (8 GB whole at 10^9 labels), each rank's positions' in its own.
    assert "output_layer.output_labels" not in load_file(tmp_path / "model" / "model.safetensors")
    assert {"output_layer.head.label_ids", "output_layer.tail.label_ids"} <= set(
        load_file(tmp_path / "model" / output_shard_file(0, 1))
    )
    capfd.readouterr()
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert_state(loaded, whole)
    assert isinstance(loaded.label_names, LabelNameTable) and loaded.label_names == model.label_names
    assert "MISSING" not in "".join(capfd.readouterr())  # transformers' report of weights it did not find
    split_in_two(tmp_path / "model")
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "model"), whole)
    other = make_tiny_model(40, head_label_count=5, training=False, seed=5)
    load_folder_rows_(other, tmp_path / "model")  # a whole layer reads every row
    assert_state(other, whole)


def test_a_sharded_bf16_output_layer_loads_whole_in_bf16(tmp_path, one_process_group):
    # The shards store a bf16 head and tail under a float32 encoder: one process loads them so, not in float32.
    _, whole = sharded_save(tmp_path / "model", output_dtype=torch.bfloat16)
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert loaded.output_layer.tail.weight.dtype == loaded.output_layer.head.weight.dtype == torch.bfloat16
    assert all(value.dtype == loaded.state_dict()[name].dtype for name, value in whole.items())
    assert_state(loaded, whole)


def test_a_plain_save_over_a_sharded_folder_removes_its_shards_and_back(tmp_path, one_process_group):
    model, whole = sharded_save(tmp_path / "model")
    plain = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    plain.save_pretrained(tmp_path / "model")
    assert not any(name.startswith("model-output") for name in os.listdir(tmp_path / "model"))
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "model"), whole)
    save_sharded_folder(model, tmp_path / "model")
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "model"), whole)


def test_a_rank_reads_only_the_shards_that_hold_its_rows(tmp_path, one_process_group):
    sharded_save(tmp_path / "model")
    split_in_two(tmp_path / "model")
    shards = OutputShards.open(tmp_path / "model")
    opened = []
    original = shards._slice
    shards._slice = lambda shard, name, rows: opened.append(shard["file"]) or original(shard, name, rows)
    whole = load_file(tmp_path / "model" / output_shard_file(1, 2))["output_layer.tail.weight"]
    assert torch.equal(shards.read_rows("output_layer.tail.weight", 6, 9), whole[1:4])
    assert opened == [output_shard_file(1, 2)]
    assert shards.read_rows("output_layer.head.bias", 3, 3).shape == (0,)


def _tamper(folder, case):
    index = json.loads((folder / OUTPUT_SHARDS_INDEX).read_text())
    shards = index["shards"]
    if case == "outside":
        shutil.copy(folder / shards[1]["file"], folder.parent / "outside.safetensors")
        shards[1]["file"] = "../outside.safetensors"
    elif case == "absolute":
        shards[1]["file"] = str(folder / shards[1]["file"])
    elif case == "overlap":
        shards[1]["tail_groups"] = [4, 9]
    elif case == "gap":
        shards[1]["head_rows"] = [4, 5]
    elif case == "missing":
        del shards[1]
    elif case == "twice":
        shards[1]["file"] = shards[0]["file"]
    elif case == "shape":
        name = folder / shards[1]["file"]
        tensors = load_file(name)
        tensors["output_layer.tail.weight"] = tensors["output_layer.tail.weight"][:3].contiguous()
        save_file(tensors, name)
    elif case == "link":
        os.rename(folder / shards[1]["file"], folder.parent / "elsewhere.safetensors")
        os.symlink(folder.parent / "elsewhere.safetensors", folder / shards[1]["file"])
    elif case == "not json":
        (folder / OUTPUT_SHARDS_INDEX).write_text("{")
        return
    elif case == "format":
        index["format"] = "something else"
    (folder / OUTPUT_SHARDS_INDEX).write_text(json.dumps(index))


@pytest.mark.parametrize(
    "case, message",
    [
        ("outside", "names no safetensors file of the folder itself"),
        ("absolute", "names no safetensors file of the folder itself"),
        ("overlap", "overlap at 5"),
        ("gap", "leave a gap at 3"),
        ("missing", "shard files are missing"),
        ("twice", "names a shard file twice"),
        ("shape", "of shape (3, 4, 8) where its rows [5, 9] need (4, 4, 8)"),
        ("link", "is a link"),
        ("not json", "is not JSON"),
        ("format", "is not a version-1 HASTE output-shards index"),
    ],
)
def test_nothing_in_the_index_is_trusted(tmp_path, one_process_group, case, message):
    sharded_save(tmp_path / "model")
    split_in_two(tmp_path / "model")
    _tamper(tmp_path / "model", case)
    with pytest.raises(ValueError) as error:
        HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_save_that_fails_on_a_rank_leaves_the_folder_as_it_was(tmp_path, one_process_group, monkeypatch):
    model, whole = sharded_save(tmp_path / "model")
    before = {name: (tmp_path / "model" / name).read_bytes() for name in os.listdir(tmp_path / "model")}

    def full_disk(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(shard_checkpoints, "write_safetensors", full_disk)
    with torch.no_grad():
        model.output_layer.tail.weight.add_(1.0)
    with pytest.raises(OSError, match="rank 0: No space left on device"):
        save_sharded_folder(model, tmp_path / "model")
    after = {name: (tmp_path / "model" / name).read_bytes() for name in os.listdir(tmp_path / "model")}
    assert after == before
    with torch.no_grad():
        model.output_layer.tail.weight.view(-1)[0] = float("nan")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="rank 0: Refusing to save non-finite"):
        save_sharded_folder(model, tmp_path / "model")
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "model"), whole)


def test_a_checkpoint_with_a_damaged_shard_is_not_complete(tmp_path, one_process_group):
    sharded_save(tmp_path / "checkpoint-4")
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    assert checkpoint_problem(tmp_path / "checkpoint-4") is None
    shard = tmp_path / "checkpoint-4" / output_shard_file(0, 1)
    shard.write_bytes(shard.read_bytes()[:100])
    assert checkpoint_problem(tmp_path / "checkpoint-4").startswith(f"a damaged {output_shard_file(0, 1)}")
    _tamper_gap = json.loads((tmp_path / "checkpoint-4" / OUTPUT_SHARDS_INDEX).read_text())
    _tamper_gap["shards"][0]["tail_groups"] = [0, 8]
    (tmp_path / "checkpoint-4" / OUTPUT_SHARDS_INDEX).write_text(json.dumps(_tamper_gap))
    assert checkpoint_problem(tmp_path / "checkpoint-4").startswith(f"an invalid {OUTPUT_SHARDS_INDEX}")


@pytest.mark.slow
def test_a_two_rank_checkpoint_resumes_on_three_ranks_and_on_one(tmp_path):
    """Saved by 2 ranks (head 3 + 2 rows, tail 5 + 4 groups), resumed by 3 (2 + 2 + 1 rows, 3 + 3 + 3 groups) and by
    one process: every rank starts from the saved weights and momentum, having read only its own rows of the
    shards. The one process's checkpoint (one file, as earlier versions saved sharded runs too) resumes on 3 ranks.
    A save whose rank 1 fails raises on both ranks and leaves the saved model as it was."""
    import distributed_shard_resume as script

    torchrun([str(TESTS / "distributed_shard_resume.py"), str(tmp_path), "save"], tmp_path, processes=2)
    saved = torch.load(tmp_path / "saved.pt", weights_only=False)
    errors = [json.loads((tmp_path / f"failed-{rank}.json").read_text()) for rank in range(2)]
    assert errors[0] == "OSError: rank 1: disk full", errors
    assert errors[1] == "OSError: Saving " + str(tmp_path / "model") + " failed (on rank 0): rank 1: disk full"
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "model"), saved["state"])
    momentum = {
        name: value
        for rank in range(2)
        for name, value in load_file(tmp_path / "run" / "checkpoint-4" / output_shard_file(rank, 2)).items()
        if name.startswith("optimizer.")
    }
    assert sorted(momentum) == sorted(f"optimizer.{name}.momentum_buffer" for name in saved["momentum"])
    output_state = torch.load(tmp_path / "run" / "checkpoint-4" / "optimizer.pt", weights_only=True)["output"]
    assert all(
        value.dim() == 0
        for entry in output_state["state"].values()
        for value in entry.values()
        if torch.is_tensor(value)
    )

    one = script.resume(tmp_path / "one", tmp_path / "run" / "checkpoint-4", 6, save=True)
    assert not (tmp_path / "one" / "checkpoint-6" / OUTPUT_SHARDS_INDEX).exists()  # one file, as before sharding
    torchrun([str(TESTS / "distributed_shard_resume.py"), str(tmp_path), "load"], tmp_path, processes=3)
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=False)
    for run, step, expected in ((loaded["sharded"], 6, saved), (one, 6, saved), (loaded["one file"], 8, one["end"])):
        assert run["step"] == step
        assert_state_equal(run["start"]["state"], expected["state"])
        assert_state_equal(run["start"]["momentum"], expected["momentum"])
    group_size = 4
    loaded = loaded["sharded"]
    shares = [(owned["head_rows"], owned["tail_groups"]) for owned, _ in loaded["reads"]]
    assert shares == [((0, 2), (0, 3)), ((2, 4), (3, 6)), ((4, 5), (6, 9))]
    for owned, reads in [*loaded["reads"], *one["reads"]]:
        assert reads and all(
            (start, stop) == row_range(name, owned["head_rows"], owned["tail_groups"], group_size)
            for name, start, stop in reads
        ), (owned, reads)


def assert_state_equal(actual: dict, expected: dict):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


@pytest.mark.slow
def test_predict_under_torchrun_scores_each_ranks_share_and_equals_one_process(tmp_path, one_process_group):
    """`torchrun -m haste_hf.cli predict` on 2 processes of a folder saved by 1 rank: each rank builds its share of
    the output layer empty and reads its rows (`load_folder_rows_`, whose reads the test above checks), the ranks'
    top-k are merged, rank 0 writes the file: the same top-k as one process."""
    from tiny_encoders import planted_texts, tiny_tokenizer

    from haste_hf.cli import main

    model, _ = sharded_save(tmp_path / "model")
    tiny_tokenizer(tmp_path / "model")
    texts = [row["text"] for row in planted_texts(40, 11, seed=4)]  # 6 + 5 texts on the 2 ranks
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    command = ["predict", "--model", tmp_path / "model", "--input", tmp_path / "texts.txt", "-k", "3", "--logits"]
    assert main([*map(str, command), "--output", str(tmp_path / "one.jsonl")]) == 0
    launched = torchrun(["-m", "haste_hf.cli", *command, "--output", tmp_path / "two.jsonl"], tmp_path, timeout=300)
    assert launched.stdout.count("Wrote the top 3 labels of 11 texts") == 1, launched.stdout
    one, two = (
        [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()] for name in ("one", "two")
    )
    assert [row["label_ids"] for row in two] == [row["label_ids"] for row in one] and len(one) == 11
    assert [row["labels"] for row in two] == [row["labels"] for row in one]
    for mine, theirs in zip(two, one):
        assert mine["logits"] == pytest.approx(theirs["logits"], abs=1e-5)


def test_a_push_from_a_checkpoint_takes_its_shards_along(tmp_path, one_process_group, monkeypatch):
    """Trainer's push of a checkpoint (`hub_strategy`) copies its config and weight files into `output_dir` and
    uploads that: a sharded checkpoint's shard files and index go along (the upload itself is stubbed here)."""
    from datasets import Dataset
    from tiny_encoders import planted_texts, tiny_tokenizer
    from tiny_haste import make_tiny_trainer
    from transformers import Trainer

    sharded_save(tmp_path / "run" / "checkpoint-4")
    trainer = make_tiny_trainer(
        tmp_path / "run", tiny_tokenizer(tmp_path / "tokenizer"), Dataset.from_list(planted_texts(40, 8))
    )
    monkeypatch.setattr(Trainer, "_push_from_checkpoint", lambda self, folder: None)
    trainer._push_from_checkpoint(str(tmp_path / "run" / "checkpoint-4"))
    for name in (OUTPUT_SHARDS_INDEX, output_shard_file(0, 1)):
        assert (tmp_path / "run" / name).read_bytes() == (tmp_path / "run" / "checkpoint-4" / name).read_bytes()


def test_a_weights_index_naming_a_file_outside_the_folder_is_refused(tmp_path, one_process_group):
    """What a rank reads besides the shards: transformers' weight index, whose names are not trusted either."""
    sharded_save(tmp_path / "model")
    os.rename(tmp_path / "model" / "model.safetensors", tmp_path / "outside.safetensors")
    weight_map = {name: "../outside.safetensors" for name in load_file(tmp_path / "outside.safetensors")}
    (tmp_path / "model" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ValueError, match=r"names '../outside.safetensors', not a safetensors file beside it"):
        load_folder_rows_(make_tiny_model(40, head_label_count=5), tmp_path / "model")


def test_the_final_save_links_the_last_checkpoints_shards_where_they_hold_its_rows(tmp_path):
    """At 10^9 labels a checkpoint and a final save of 147 GB each do not fit a 235 GB disk: a run whose last
    checkpoint (weights only) is its final state links each rank's shard file into the final folder; a shard that
    differs by one byte, or rows changed since, are written again, and the folder always holds the model's rows."""
    torchrun([str(TESTS / "distributed_shard_links.py"), str(tmp_path)], tmp_path, timeout=600)
    ranks = torch.load(tmp_path / "results.pt")
    assert len(ranks) == 2
    for results in ranks:
        assert results["as_trained"] == {"linked": True, "holds_the_model": True}
        assert results["weights_changed"] == {"linked": False, "holds_the_model": True}
        assert results["checkpoint_changed"] == {"linked": False, "holds_the_model": True}


@pytest.mark.parametrize("case", ["another_file_system", "a_link", "more_tensors"])
def test_a_shard_is_written_where_it_cannot_be_linked(tmp_path, one_process_group, monkeypatch, case):
    """Across file systems (os.link fails), from a link, or from a file of other tensors (a checkpoint with its
    momentum), the shard is written, not linked, and the folder loads."""
    model, whole = sharded_save(tmp_path / "checkpoint")
    shard = tmp_path / "checkpoint" / output_shard_file(0, 1)
    if case == "another_file_system":

        def cross_device_link(*args, **kwargs):
            raise OSError(18, "Invalid cross-device link")

        monkeypatch.setattr(shard_checkpoints.os, "link", cross_device_link)
    elif case == "a_link":
        shutil.move(shard, tmp_path / "elsewhere.safetensors")
        shard.symlink_to(tmp_path / "elsewhere.safetensors")
    else:
        tensors = load_file(shard)
        save_file({**tensors, "optimizer.extra": torch.ones(2)}, shard, metadata={"format": "pt"})
    save_sharded_folder(model, tmp_path / "final", link_from=str(tmp_path / "checkpoint"))
    final = tmp_path / "final" / output_shard_file(0, 1)
    assert not final.is_symlink() and os.stat(final).st_ino != os.stat(shard).st_ino
    assert_state(HasteForExtremeClassification.from_pretrained(tmp_path / "final"), whole)
    monkeypatch.undo()
    save_sharded_folder(model, tmp_path / "linked", link_from=str(tmp_path / "final"))  # the control: it links
    assert os.stat(tmp_path / "linked" / output_shard_file(0, 1)).st_ino == os.stat(final).st_ino


def test_load_sharded_model_makes_the_share_on_the_device_it_serves_on(tmp_path, one_process_group, monkeypatch):
    """`haste-hf predict` under torchrun: the share's rows are made empty on the rank's device and read into it piece
    by piece, never held by the host process first (37 GB a rank at 10^9 labels on 4 GPUs). On a CPU machine the
    device is the CPU: the test checks the device is passed down and every share tensor is made on it."""
    from haste_hf.training import sharded_output_layer

    _, whole = sharded_save(tmp_path / "model")
    asked = []
    shard = sharded_output_layer.ShardedOutputLayer.shard.__func__

    def recording_shard(cls, layer, group=None, initialize=True, rows_device=None):
        asked.append(rows_device)
        return shard(cls, layer, group, initialize, rows_device)

    monkeypatch.setattr(sharded_output_layer.ShardedOutputLayer, "shard", classmethod(recording_shard))
    model = shard_checkpoints.load_sharded_model(tmp_path / "model", device=torch.device("cpu"))
    assert asked == [torch.device("cpu")]
    state = model.state_dict()
    for name in ("output_layer.head.weight", "output_layer.tail.weight", "output_layer.tail.supports"):
        assert torch.equal(state[name], whole[name]), name
    assert torch.equal(state["output_layer.output_labels"], whole["output_layer.output_labels"])


def test_a_share_built_empty_is_made_on_the_device_asked_for(one_process_group):
    from haste_hf.modeling.initialization import deferred_output_rows

    with deferred_output_rows():
        model = make_tiny_model(40, head_label_count=5, training=False)
    layer = shard_output_layer_(model, initialize=False, rows_device="meta")
    tensors = [layer.head.weight, layer.head.bias, layer.tail.weight, layer.tail.supports, layer.output_labels]
    assert all(tensor.device.type == "meta" for tensor in tensors)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_load_sharded_model_on_a_gpu_holds_no_share_on_the_host(tmp_path, one_process_group):
    """A share of 160 MB of fp32 tail weights loaded onto the GPU: the host's peak grows by far less than the share."""
    import resource

    from haste_hf.modeling.initialization import deferred_output_rows

    with deferred_output_rows():
        model = make_tiny_model(1_600_000, head_label_count=0, group_size=16, fan_in=32, training=False)
    shard_output_layer_(model)
    save_sharded_folder(model, tmp_path / "model")
    share_bytes = model.output_layer.tail.weight.numel() * 4
    del model
    torch.zeros(1, device="cuda")  # the CUDA context's host memory, before the measure
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    loaded = shard_checkpoints.load_sharded_model(tmp_path / "model", device=torch.device("cuda"))
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert loaded.output_layer.tail.weight.device.type == "cuda"
    assert added < share_bytes / 2, (added, share_bytes)


def test_momentum_in_shards_of_a_folder_without_a_shards_index_is_refused(tmp_path):
    """optimizer.pt says the output momentum is in the shards (a sharded run's checkpoint), but the folder holds no
    shards index: a resume is refused naming the folder and the missing file, before any momentum is read."""
    model = make_tiny_model(40, head_label_count=5)
    optimizer = torch.optim.Adam(model.output_layer.parameters())
    with pytest.raises(
        ValueError, match=f"its optimizer state is in output shards, but it holds no {OUTPUT_SHARDS_INDEX}"
    ):
        shard_checkpoints.load_output_momentum_(model, optimizer, {0: ["exp_avg"]}, str(tmp_path))


def test_row_range_of_each_row_sharded_tensor_and_a_refusal_of_any_other():
    """Head rows 1-3 and tail groups 2-5 of groups of 4: the head's tensors and optimizer entries take the head rows,
    the tail's the groups, the tail bias the groups' labels; a tensor that is not row-sharded is a KeyError naming it."""
    from haste_hf.modeling.output_shards import optimizer_entry_name

    ranges = dict(head_rows=(1, 3), tail_groups=(2, 5), group_size=4)
    expected = {
        "output_layer.head.weight": (1, 3),
        "output_layer.head.bias": (1, 3),
        "output_layer.tail.weight": (2, 5),
        "output_layer.tail.supports": (2, 5),
        "output_layer.tail.bias": (8, 20),
        optimizer_entry_name("output_layer.tail.weight", "momentum_buffer"): (2, 5),
        optimizer_entry_name("output_layer.head.weight", "exp_avg"): (1, 3),
    }
    assert {name: tuple(row_range(name, **ranges)) for name in expected} == expected
    for name in ("encoder.embeddings.word_embeddings.weight", "output_layer.output_labels", "tail.bias.extra"):
        with pytest.raises(KeyError, match=f"{name} is not a row-sharded tensor of the output layer"):
            row_range(name, **ranges)


def test_a_safetensors_file_written_in_pieces_holds_every_row(tmp_path, monkeypatch):
    """`write_safetensors` copies a tensor to the host a piece of rows at a time (256 MB; 64 bytes here, so that
    every tensor takes several pieces): safetensors reads back every tensor whole, whatever its rows, columns, dtype
    or rank, and the metadata."""
    from safetensors import safe_open

    monkeypatch.setattr(shard_checkpoints, "_PIECE_BYTES", 64)
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "many_rows_few_columns": torch.randn(100, 3, generator=generator),  # 5 rows a piece, 20 pieces
        "one_dimension": torch.randint(-(2**40), 2**40, (50,), generator=generator),  # 8 values a piece
        "rows_past_a_piece": torch.randn(7, 40, generator=generator).to(torch.bfloat16),  # 1 row a piece
        "three_dimensions": torch.randint(0, 1000, (9, 2, 3), generator=generator, dtype=torch.int32),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.empty(0, 4),
    }
    path = tmp_path / "pieces.safetensors"
    shard_checkpoints.write_safetensors(str(path), tensors, {"format": "pt"})
    loaded = load_file(path)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_a_sharded_saves_output_momentum_goes_to_the_shards_and_comes_back_row_for_row(tmp_path, one_process_group):
    """With the output optimizer, a sharded save writes each sharded weight's momentum rows into the shards;
    `output_optimizer_state_to_save` leaves those out of optimizer.pt (naming them, keeping the rest) and
    `load_output_momentum_` reads them back into a fresh optimizer, equal to the saved ones."""
    from haste_hf.training.optimization import StochasticRoundingSGD
    from haste_hf.training.shard_checkpoints import ROWS_IN_SHARDS_KEY

    model = make_tiny_model(40, head_label_count=5, training=False)
    layer = shard_output_layer_(model)
    optimizer = StochasticRoundingSGD(layer.output_parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    for param in layer.output_parameters():
        param.grad = torch.randn(param.shape, generator=generator)
    optimizer.step()
    save_sharded_folder(model, tmp_path / "checkpoint", output_optimizer=optimizer)
    shard = load_file(next((tmp_path / "checkpoint").glob("model-output-*.safetensors")))
    names = {id(param): name for name, param in layer.named_parameters()}
    for param in layer.output_parameters():
        stored = shard[f"optimizer.output_layer.{names[id(param)]}.momentum_buffer"]
        assert torch.equal(stored, optimizer.state[param]["momentum_buffer"]), names[id(param)]
    to_save = shard_checkpoints.output_optimizer_state_to_save(model, optimizer)
    moved = to_save.pop(ROWS_IN_SHARDS_KEY)
    assert moved == {index: ["momentum_buffer"] for index in range(len(layer.output_parameters()))}
    assert all("momentum_buffer" not in entry for entry in to_save["state"].values())
    fresh = StochasticRoundingSGD(layer.output_parameters(), lr=0.1, momentum=0.9)
    fresh.load_state_dict(to_save)
    shard_checkpoints.load_output_momentum_(model, fresh, moved, str(tmp_path / "checkpoint"))
    for param in layer.output_parameters():
        assert torch.equal(fresh.state[param]["momentum_buffer"], optimizer.state[param]["momentum_buffer"])


def test_a_safetensors_file_holds_exactly_its_tensors_or_is_not_linked(tmp_path):
    """`_holds_exactly` (whether a checkpoint's shard may be linked instead of written): the same names, metadata,
    dtypes, shapes and bytes; another name, metadata, dtype, shape or byte is not; a dtype safetensors cannot hold
    is refused naming the tensor."""
    tensors = {"a": torch.arange(12.0).reshape(4, 3), "b": torch.tensor([1, 2], dtype=torch.int64)}
    path = str(tmp_path / "file.safetensors")
    shard_checkpoints.write_safetensors(path, tensors, {"format": "pt"})
    assert shard_checkpoints._holds_exactly(path, tensors, {"format": "pt"})
    others = [
        ({**tensors, "c": torch.zeros(1)}, {"format": "pt"}),
        (tensors, {"format": "other"}),
        ({**tensors, "b": tensors["b"].to(torch.int32)}, {"format": "pt"}),
        ({**tensors, "a": tensors["a"].reshape(3, 4)}, {"format": "pt"}),
        ({**tensors, "a": tensors["a"] + torch.eye(4, 3)}, {"format": "pt"}),
    ]
    for other, metadata in others:
        assert not shard_checkpoints._holds_exactly(path, other, metadata)
    with pytest.raises(ValueError, match=r"c: safetensors holds no torch.complex64"):
        shard_checkpoints.write_safetensors(path, {"c": torch.zeros(2, dtype=torch.complex64)})


def test_a_folder_that_is_no_checkpoint_of_the_model_is_refused_naming_the_tensor(tmp_path, one_process_group):
    """`load_folder_rows_`: a folder without weights, weights without a tensor the model has (its label ids or
    another) and a tensor of another shape are each refused naming the folder and the tensor (shards that miss a
    tensor or rows are refused as `OutputShards.open` reads them: `test_nothing_in_the_index_is_trusted`)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    model = make_tiny_model(40, head_label_count=5, training=False)
    with pytest.raises(FileNotFoundError, match="No model.safetensors .* not a HASTE checkpoint folder"):
        load_folder_rows_(model, empty)
    saved = make_tiny_model(40, head_label_count=5, training=False)
    weights = {name: value.contiguous() for name, value in saved.state_dict().items()}
    cases = {
        "output_layer.output_labels": "holds no tensor 'output_layer.output_labels'",
        "encoder.encoder.layer.0.output.dense.bias": "holds no tensor 'encoder.encoder.layer.0.output.dense.bias'",
    }
    for missing, message in cases.items():
        folder = tmp_path / missing
        folder.mkdir()
        save_file({name: value for name, value in weights.items() if name != missing}, folder / "model.safetensors")
        with pytest.raises(KeyError, match=message):
            load_folder_rows_(make_tiny_model(40, head_label_count=5, training=False), folder)
    folder = tmp_path / "shape"
    folder.mkdir()
    save_file({**weights, "encoder.encoder.layer.0.output.dense.bias": torch.zeros(3)}, folder / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"encoder.encoder.layer.0.output.dense.bias has shape \(3,\) where this rank needs"
    ):
        load_folder_rows_(make_tiny_model(40, head_label_count=5, training=False), folder)
