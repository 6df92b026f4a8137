"""Bad inputs and faults: each case asserts a clear error (naming the argument, file or count at fault)
or the correct result, and that no half-written output is left behind.

Sections: saving and loading; training divergence; labels and data; the command line."""

import json
import os
import re
import shutil
import stat
from functools import partial

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file, save_file
from tiny_encoders import planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer
from transformers import PreTrainedModel
from transformers import TrainerCallback as TrainerCallbackBase

import haste_hf.hub
from haste_hf import HasteForExtremeClassification
from haste_hf.saving import (
    INCOMPLETE_SAVE_FILE,
    STAGING_PREFIX,
    checkpoint_is_complete,
    last_complete_checkpoint,
    save_folder_atomically,
)
from haste_hf.training_args import HasteTrainingArguments


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


# ------------------------------------------------------------------------------------- saving and loading


def test_save_into_a_writable_folder_under_a_read_only_parent(tmp_path, monkeypatch):
    target = tmp_path / "volume" / "model"
    target.mkdir(parents=True)
    # Permissions do not bind root (CI may run as root): also check that nothing appears in the parent.
    parent_listings = []
    write = PreTrainedModel.save_pretrained

    def watched(self, directory, *args, **kwargs):
        result = write(self, directory, *args, **kwargs)
        parent_listings.append(sorted(os.listdir(tmp_path / "volume")))
        return result

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", watched)
    os.chmod(tmp_path / "volume", stat.S_IRUSR | stat.S_IXUSR)
    try:
        model = make_model()
        model.save_pretrained(target)
        model.save_pretrained(target)  # and again over the first save
    finally:
        os.chmod(tmp_path / "volume", stat.S_IRWXU)
    assert parent_listings == [["model"], ["model"]]
    assert_no_leftovers(target)
    assert torch.equal(
        HasteForExtremeClassification.from_pretrained(target).output_layer.tail.weight, model.output_layer.tail.weight
    )


def test_failed_write_leaves_the_previous_save_and_no_staging(tmp_path):
    make_model(seed=0).save_pretrained(tmp_path)
    before = folder_state(tmp_path)

    def write(staging):
        with open(os.path.join(staging, "config.json"), "w") as file:
            file.write("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_folder_atomically(tmp_path, write)
    assert folder_state(tmp_path) == before


def test_save_killed_while_files_move_in_is_refused_at_load(tmp_path):
    """A kill between the renames leaves new config + old weights: loading names the interrupted save."""
    make_model(seed=0).save_pretrained(tmp_path)
    moved = []

    def replace_then_die(source, destination):
        if moved:
            raise KeyboardInterrupt  # killed after the first file moved in
        moved.append(destination)
        os.rename(source, destination)

    new = make_model(seed=1, fan_in=4)
    original = os.replace
    os.replace = replace_then_die
    try:
        with pytest.raises(KeyboardInterrupt):
            new.save_pretrained(tmp_path)
    finally:
        os.replace = original
    assert (tmp_path / INCOMPLETE_SAVE_FILE).exists()
    with pytest.raises(OSError, match="interrupted save"):
        HasteForExtremeClassification.from_pretrained(tmp_path)
    new.save_pretrained(tmp_path)  # saving again repairs the folder
    assert_no_leftovers(tmp_path)
    assert HasteForExtremeClassification.from_pretrained(tmp_path).config.fan_in == 4


def test_a_push_of_an_interrupted_save_is_refused(tmp_path):
    make_model().save_pretrained(tmp_path)
    (tmp_path / INCOMPLETE_SAVE_FILE).write_text("{}")
    with pytest.raises(OSError, match="interrupted save"):
        haste_hf.hub.push_to_hub(tmp_path, "user/model")


def test_leftover_staging_of_a_killed_save_is_removed_by_the_next_save(tmp_path):
    make_model().save_pretrained(tmp_path)
    leftover = tmp_path / f"{STAGING_PREFIX}killed"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    make_model().save_pretrained(tmp_path)
    assert_no_leftovers(tmp_path)


def test_save_into_a_file_path_is_refused(tmp_path):
    path = tmp_path / "model"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file"):
        make_model().save_pretrained(path)
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize(
    "where", ["output_layer.tail.weight", "output_layer.head.bias", "encoder.embeddings.word_embeddings.weight"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_never_saved(tmp_path, where, value):
    model = make_model()
    with torch.no_grad():
        model.get_parameter(where).view(-1)[3] = value
    with pytest.raises(ValueError, match=f"non-finite.*{where}"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_large_finite_weights_are_saved(tmp_path):
    model = make_model()
    with torch.no_grad():
        model.output_layer.tail.weight.fill_(1e30)  # the squared norm overflows; the values do not
    model.save_pretrained(tmp_path)
    assert HasteForExtremeClassification.from_pretrained(tmp_path).output_layer.tail.weight.max() == 1e30


def corrupt(folder, name, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors[name])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("output_layer.tail.supports", lambda t: t.__setitem__((0, 0), 32), "outside \\[0, 32\\)"),
        ("output_layer.tail.supports", lambda t: t.__setitem__((2, 1), -5), "outside \\[0, 32\\)"),
        ("output_layer.tail.supports", lambda t: t.__setitem__((1, 1), t[1, 0]), "group 1 lists a feature twice"),
        ("output_layer.output_labels", lambda t: t.__setitem__(0, t[1]), "each of the 40 labels exactly once"),
        ("output_layer.output_labels", lambda t: t.__setitem__(5, 40), "each of the 40 labels exactly once"),
        ("output_layer.output_labels", lambda t: t.__setitem__(5, -7), "each of the 40 labels exactly once"),
    ],
)
def test_corrupt_weights_file_is_refused_at_load(tmp_path, name, change, message):
    make_model().save_pretrained(tmp_path)
    corrupt(tmp_path, name, change)
    with pytest.raises(ValueError, match=message):
        HasteForExtremeClassification.from_pretrained(tmp_path)


def test_save_pretrained_pushes_to_the_folders_name_not_the_staging_folder(tmp_path, monkeypatch):
    pushed = []
    monkeypatch.setattr(haste_hf.hub, "push_to_hub", lambda model, repo_id, **kwargs: pushed.append((repo_id, kwargs)))
    model = make_model()
    model.save_pretrained(tmp_path / "my-model", push_to_hub=True, private=True)
    model.save_pretrained(tmp_path / "other", push_to_hub=True, repo_id="user/named")
    assert pushed == [("my-model", {"private": True}), ("user/named", {})]
    assert (tmp_path / "my-model" / "model.safetensors").exists()


# ------------------------------------------------------------------------------------------- divergence


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def train_set():
    return Dataset.from_list(planted_texts(LABELS, 64, seed=0))


make_trainer = partial(
    make_tiny_trainer,
    model_fields=dict(label_count=LABELS),
    per_device_train_batch_size=8,
    max_steps=6,
    save_strategy="no",
    logging_steps=1,
    learning_rate=1e-3,
    output_learning_rate=0.1,
    rewiring_interval=0,
)


def poison_encoder_output(model, calls):
    """Makes the encoder's output NaN at the forward passes numbered in `calls`."""
    count = [0]

    def hook(module, inputs, output):
        count[0] += 1
        if count[0] in calls:
            output[0][0, 0, 0] = float("nan")
        return output

    model.encoder.register_forward_hook(hook)


def test_a_nan_in_the_encoder_output_stops_training(tmp_path, tokenizer, train_set):
    model = make_model()
    poison_encoder_output(model, calls={3})
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model)
    with pytest.raises(FloatingPointError, match="diverged at step 3.*on_non_finite='skip'"):
        trainer.train()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_nan_in_the_encoder_output_is_skipped_when_asked(tmp_path, tokenizer, train_set):
    model = make_model()
    poison_encoder_output(model, calls={3, 5})
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip")
    trainer.train()
    assert trainer.state.global_step == 6 and trainer.non_finite_guard.skipped_steps == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [log.get("skipped_steps") for log in trainer.state.log_history if "loss" in log][-1] == 2
    trainer.save_model(tmp_path / "final")
    HasteForExtremeClassification.from_pretrained(tmp_path / "final")


def test_a_run_that_skipped_most_of_its_steps_fails_and_says_how_many(tmp_path, tokenizer, train_set, caplog):
    model = make_model()
    poison_encoder_output(model, calls={1, 2, 4, 5})
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip")
    with pytest.raises(FloatingPointError, match="4 of its 6 optimizer steps were skipped.*not saved"):
        trainer.train()
    assert "4 of 6 optimizer steps were skipped" in caplog.text


def test_a_run_that_skipped_half_of_its_steps_or_fewer_says_how_many(tmp_path, tokenizer, train_set, caplog):
    model = make_model()
    poison_encoder_output(model, calls={1, 3, 5})
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip")
    trainer.train()
    assert trainer.non_finite_guard.skipped_steps == 3 and "3 of 6 optimizer steps were skipped" in caplog.text


def test_a_skipped_step_leaves_weights_and_momentum_untouched(tmp_path, tokenizer, train_set):
    model = make_model()
    poison_encoder_output(model, calls={2})
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip", max_steps=2)
    snapshots = []

    class Snapshot(TrainerCallbackBase):
        def on_step_end(self, args, state, control, **kwargs):
            snapshots.append({name: p.detach().clone() for name, p in model.named_parameters()})

    trainer.add_callback(Snapshot())
    trainer.train()
    assert all(torch.equal(snapshots[0][name], snapshots[1][name]) for name in snapshots[0])


def test_huge_learning_rate_stops_with_a_clear_error_and_saves_nothing(tmp_path, tokenizer, train_set):
    trainer = make_trainer(
        tmp_path,
        tokenizer,
        train_set,
        learning_rate=1e6,
        output_learning_rate=1e6,
        max_steps=30,
        save_strategy="steps",
        save_steps=1,
        max_grad_norm=0.0,
    )
    with pytest.raises(FloatingPointError, match="diverged at step"):
        trainer.train()
    for checkpoint in tmp_path.glob("checkpoint-*"):
        if (checkpoint / "model.safetensors").exists():
            HasteForExtremeClassification.from_pretrained(checkpoint)  # every checkpoint saved is finite
            assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())


def test_skipping_cannot_recover_non_finite_weights(tmp_path, tokenizer, train_set):
    model = make_model()
    with torch.no_grad():
        model.output_layer.tail.weight[0, 0, 0] = float("inf")
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip")
    with pytest.raises(FloatingPointError, match="weights themselves"):
        trainer.train()


def test_resume_passes_over_a_checkpoint_a_kill_left_half_written(tmp_path, tokenizer, train_set):
    make_trainer(tmp_path, tokenizer, train_set, max_steps=4, save_strategy="steps", save_steps=2).train()
    half_written = tmp_path / "checkpoint-6"
    half_written.mkdir()
    (half_written / "model.safetensors").write_bytes(b"partial")
    truncated = tmp_path / "checkpoint-5"
    truncated.mkdir()
    (truncated / "trainer_state.json").write_text('{"global_step": 5, "log_hist')
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    resumed = make_trainer(tmp_path, tokenizer, train_set, max_steps=6, save_strategy="no")
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6 and len([log for log in resumed.state.log_history if "loss" in log]) == 6
    with pytest.raises(ValueError, match="checkpoint-6 is not a complete checkpoint.*resume from .*checkpoint-4"):
        make_trainer(tmp_path, tokenizer, train_set).train(resume_from_checkpoint=str(half_written))


def test_resume_passes_over_a_checkpoint_whose_model_save_was_interrupted(tmp_path, tokenizer, train_set):
    """The trainer state is complete, but the mark of an interrupted model save is still there."""
    make_trainer(tmp_path, tokenizer, train_set, max_steps=4, save_strategy="steps", save_steps=2).train()
    interrupted = tmp_path / "checkpoint-6"
    shutil.copytree(tmp_path / "checkpoint-4", interrupted)
    state = json.loads((interrupted / "trainer_state.json").read_text())
    (interrupted / "trainer_state.json").write_text(json.dumps({**state, "global_step": 6}))
    (interrupted / INCOMPLETE_SAVE_FILE).write_text("{}")
    assert not checkpoint_is_complete(interrupted) and checkpoint_is_complete(tmp_path / "checkpoint-4")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    resumed = make_trainer(tmp_path, tokenizer, train_set, max_steps=6, save_strategy="no")
    resumed.train(resume_from_checkpoint=True)
    assert [log["step"] for log in resumed.state.log_history if "loss" in log] == [1, 2, 3, 4, 5, 6]


def test_resume_with_no_complete_checkpoint_is_refused(tmp_path, tokenizer, train_set):
    (tmp_path / "checkpoint-2").mkdir()
    with pytest.raises(ValueError, match="No complete checkpoint to resume from"):
        make_trainer(tmp_path, tokenizer, train_set).train(resume_from_checkpoint=True)


def test_unknown_non_finite_action_is_refused(tmp_path):
    with pytest.raises(ValueError, match="`on_non_finite` must be one of"):
        HasteTrainingArguments(output_dir=str(tmp_path), on_non_finite="ignore")


# ------------------------------------------------------------------------------------------ labels and data


def batch(model, size=3):
    torch.manual_seed(1)
    return torch.randint(5, 100, (size, 7)), torch.ones(size, 7, dtype=torch.long)


@pytest.mark.parametrize(
    "labels, message",
    [
        (torch.full((3, LABELS), 2.0), "targets in \\[0, 1\\]"),
        (torch.full((3, LABELS), -0.5), "targets in \\[0, 1\\]"),
        (torch.zeros(3, LABELS).index_fill_(1, torch.tensor([4]), float("nan")), "NaN is not one"),
        (torch.tensor([[1, 2], [3, 0], [5, 6]], dtype=torch.uint8), "dtype torch.uint8"),
        (torch.tensor([[1, 40], [3, -100], [5, 6]]), "outside \\[0, 40\\)"),
        (torch.tensor([[1, -7], [3, -100], [5, 6]]), "outside \\[0, 40\\)"),
        (torch.zeros(3, LABELS - 1), "needs 40 columns, got 39"),
    ],
)
def test_bad_labels_are_refused(labels, message):
    model = make_model()
    input_ids, attention_mask = batch(model)
    with pytest.raises(ValueError, match=message):
        model(input_ids, attention_mask, labels=labels)


def test_labels_as_int8_ids_bool_uint8_multi_hot_or_soft_targets_give_the_right_loss():
    model = make_model().eval()
    input_ids, attention_mask = batch(model)
    ids = torch.tensor([[1, 2], [3, -100], [5, 39]])
    dense = torch.zeros(3, LABELS)
    dense[[0, 0, 1, 2, 2], [1, 2, 3, 5, 39]] = 1.0
    reference = model(input_ids, attention_mask, labels=ids).loss
    for labels in (ids.to(torch.int8), ids.to(torch.int32), dense.bool(), dense, dense.to(torch.uint8)):
        assert torch.allclose(model(input_ids, attention_mask, labels=labels).loss, reference)
    soft = dense * 0.5
    logits = model(input_ids, attention_mask).logits
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, soft, reduction="sum") / 3
    assert torch.allclose(model(input_ids, attention_mask, labels=soft).loss, expected, rtol=1e-5)


def test_semantic_grouping_of_labels_without_any_positive_keeps_them_all():
    from haste_hf.grouping import group_labels

    grouping = group_labels(torch.zeros(LABELS, 8), torch.arange(4, LABELS), 4, "semantic", device="cpu")
    assert sorted(grouping.order.tolist()) == list(range(4, LABELS))


# ---------------------------------------------------------------------------------------------- command line

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


def run_cli(capsys, argv):
    """Exit status and stderr lines of `haste-hf ARGV`."""
    from haste_hf.cli import main

    capsys.readouterr()  # what the test's own setup printed
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as exit:
        status = exit.code
    # Progress bars (loading weights, predicting) and their cursor moves are not messages.
    lines = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).strip() for line in capsys.readouterr().err.split("\n"))
    return status, [line for line in lines if line and not re.search(r"\d+%\|", line)]


def assert_one_line_error(status, lines, expected_status, command, *fragments):
    assert status == expected_status, lines
    assert len(lines) == 1 and lines[0].startswith(f"haste-hf {command}: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


# Each: the flags after the command, and fragments the one line must contain. Checked while parsing.
TRAIN_USAGE_ERRORS = [
    (["--batch-size", "0"], ["`per_device_train_batch_size` must be >= 1, got 0"]),
    (["--per-device-train-batch-size", "-3"], ["`per_device_train_batch_size` must be >= 1, got -3"]),
    (["--batch-size", "eight"], ["--per-device-train-batch-size", "invalid int value: 'eight'"]),
    (["--gradient-accumulation-steps", "0"], ["`gradient_accumulation_steps` must be >= 1"]),
    (["--eval-batch-size", "0"], ["`per_device_eval_batch_size` must be >= 1"]),
    (["--validation-fraction", "1"], ["`validation_fraction` must lie in [0, 1)", "got 1.0"]),
    (["--validation-fraction", "-0.1"], ["`validation_fraction` must lie in [0, 1)"]),
    (["--validation-fraction", "nan"], ["`validation_fraction` must lie in [0, 1)", "got nan"]),
    (["--epochs", "0"], ["`num_train_epochs` must be > 0"]),
    (["--max-steps", "0"], ["`max_steps` must be >= 1, or -1"]),
    (["--lr=-1e-5"], ["`learning_rate` must be >= 0"]),
    (["--output-lr=-0.1"], ["`output_learning_rate` must be >= 0"]),
    (["--output-momentum", "1"], ["`output_momentum` must lie in [0, 1)"]),
    (["--eval-strategy", "steps", "--save-strategy", "steps", "--eval-steps", "0"], ["`eval_steps` must be > 0"]),
    (["--logging-steps", "0"], ["non-zero --logging_steps"]),
    (["--group-size", "0"], ["`group_size` must be >= 1"]),
    (["--fan-in", "0"], ["`fan_in` must be >= 1"]),
    (["--head-fraction", "1.5"], ["`head_label_fraction` must lie in [0, 1]"]),
    (["--max-length", "0"], ["`max_length` must be >= 1"]),
    (["--rewiring-fraction", "0"], ["rewiring_fraction"]),
    (["--rewiring-end", "2"], ["rewiring_end"]),
    (["--rewiring-interval=-5"], ["`rewiring_interval` must be >= 0"]),
    (["--beta", "0.5"], ["`beta`", "must be >= 1"]),
    (["--num-workers=-1"], ["`dataloader_num_workers` must be >= 0"]),
    (["--propensity-a", "0"], ["`propensity_a` must be > 0"]),
    (["--on-non-finite", "ignore"], ["`on_non_finite` must be one of"]),
    (["--format", "xml"], ["`format` must be one of"]),
    (["--data", "no/such/folder"], ["`data`: no folder 'no/such/folder'"]),
    (["--encoder", "./no-such-encoder"], ["`encoder`: no folder './no-such-encoder'"]),
    (["--encoder", "a/b/c"], ["`encoder`: no folder 'a/b/c'"]),
    (["--grouping-file", "missing.safetensors"], ["`layout_file`: no file 'missing.safetensors'"]),
    (["--config", "missing.yaml"], ["--config", "missing.yaml"]),
    (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"]),
    (
        ["--validation-fraction", "0.1", "--save-strategy", "steps"],
        ["--save-strategy steps with --eval-strategy epoch", "--eval-steps N", "--validation-fraction 0"],
    ),
    (
        ["--validation-fraction", "0.1", "--save-strategy", "no"],
        ["--save-strategy no with --eval-strategy epoch", "--load-best-model-at-end false"],
    ),
    (
        ["--validation-fraction", "0.1", "--eval-strategy", "no"],
        ["--save-strategy epoch with --eval-strategy no", "--load-best-model-at-end false"],
    ),
]


@pytest.mark.parametrize(
    "flags, fragments", TRAIN_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in TRAIN_USAGE_ERRORS]
)
def test_train_usage_errors_are_one_line_before_anything_loads(capsys, monkeypatch, flags, fragments):
    import haste_hf.cli

    monkeypatch.setattr(haste_hf.cli, "command_train", lambda args: pytest.fail("the command ran"))
    status, lines = run_cli(capsys, ["train", *flags])
    assert_one_line_error(status, lines, 2, "train", *fragments)


def test_a_file_given_as_data_folder(capsys, cli_files):
    status, lines = run_cli(capsys, ["train", "--data", cli_files["texts"]])
    assert_one_line_error(status, lines, 2, "train", "`data`", "(it is a file)")


def test_a_config_file_with_an_unknown_key_is_a_one_line_error(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rte: 1.0e-4\n")
    status, lines = run_cli(capsys, ["train", "--config", config])
    assert_one_line_error(status, lines, 2, "train", "unknown key 'learning_rte'", "did you mean 'learning_rate'")


@pytest.mark.parametrize("command", ["train", "group", "evaluate"])
def test_bag_of_words_data_is_refused_up_front(capsys, cli_files, monkeypatch, tmp_path, command):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda name: pytest.fail("the encoder was loaded"))
    flags = {
        "train": ["--encoder", cli_files["model"], "--output-dir", tmp_path / "out"],
        "group": ["--output", tmp_path / "layout.safetensors"],
        "evaluate": ["--model", cli_files["model"]],
    }[command]
    status, lines = run_cli(capsys, [command, "--data", cli_files["bow"], *flags])
    assert_one_line_error(status, lines, 1, command, "is a bag-of-words dataset", "raw-text release")
    assert not (tmp_path / "out").exists() and not (tmp_path / "layout.safetensors").exists()


@pytest.mark.parametrize("data, count", [("data40", "40"), ("data20", "20")])
def test_evaluate_on_data_of_another_label_count_names_both_counts(capsys, cli_files, tmp_path, data, count):
    output = tmp_path / "metrics.json"
    status, lines = run_cli(
        capsys, ["evaluate", "--model", cli_files["model"], "--data", cli_files[data], "--output", output]
    )
    assert_one_line_error(status, lines, 2, "evaluate", "has 30 labels and the dataset " + count)
    assert not output.exists()


def test_evaluate_on_data_of_other_label_names_is_refused_unless_asked(capsys, cli_files, tmp_path):
    data = tmp_path / "renamed"
    shutil.copytree(cli_files["data"], data)
    names = [f"label {i}" if i % 10 else f"renamed {i}" for i in range(CLI_LABELS)]  # 3 of 30 differ, the first is 0
    (data / "lbl.json.gz").unlink()
    (data / "lbl.json").write_text(
        "".join(json.dumps({"uid": str(i), "title": name}) + "\n" for i, name in enumerate(names))
    )
    output = tmp_path / "metrics.json"
    status, lines = run_cli(capsys, ["evaluate", "--model", cli_files["model"], "--data", data, "--output", output])
    assert_one_line_error(
        status,
        lines,
        2,
        "evaluate",
        "3 of 30 names differ",
        "label 0 is 'label 0' in the model, 'renamed 0'",
        "--ignore-label-names",
    )
    assert not output.exists()
    status, _ = run_cli(
        capsys, ["evaluate", "--model", cli_files["model"], "--data", data, "--output", output, "--ignore-label-names"]
    )
    assert status == 0 and "P@1" in json.loads(output.read_text())


def test_evaluate_of_a_model_with_fewer_labels_than_the_summary_k(capsys, cli_files, tmp_path):
    folder = tmp_path / "three"
    make_model(label_count=3, head_label_count=1, group_size=2, fan_in=4).save_pretrained(folder)
    tiny_tokenizer(folder)
    data = tmp_path / "data3"
    data.mkdir()
    for name in ("trn.json", "tst.json"):
        (data / name).write_text(
            "".join(json.dumps({"uid": str(i), "title": f"w{i}", "target_ind": [i % 3]}) + "\n" for i in range(6))
        )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(3)))
    output = tmp_path / "metrics.json"
    status, _ = run_cli(capsys, ["evaluate", "--model", folder, "--data", data, "--output", output])
    metrics = json.loads(output.read_text())
    assert status == 0 and {"P@1", "P@3"} <= set(metrics) and "P@5" not in metrics


EVALUATE_USAGE_ERRORS = [
    (["--model", "no-such-model"], ["--model", "no folder 'no-such-model'"]),
    (["--model", "./missing/model"], ["--model", "no folder './missing/model'"]),
    (["--model", "{model}", "--output", "missing-folder/metrics.json"], ["--output", "does not exist"]),
    (["--model", "{model}", "--output", "{model}"], ["--output", "is a folder"]),
    (["--model", "{model}", "--data", "{data}", "--split", "dev"], ["--split", "'dev' is not a split", "test, train"]),
    (["--data", "{data}"], ["the following arguments are required: --model"]),
]


@pytest.mark.parametrize(
    "flags, fragments", EVALUATE_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in EVALUATE_USAGE_ERRORS]
)
def test_evaluate_usage_errors(capsys, cli_files, flags, fragments):
    flags = [flag.format(**cli_files) for flag in flags]
    status, lines = run_cli(capsys, ["evaluate", *flags])
    assert_one_line_error(status, lines, 2, "evaluate", *fragments)


PREDICT_USAGE_ERRORS = [
    (["--input", "missing.txt"], ["--input", "no file 'missing.txt'"]),
    (["--input", "{empty}"], ["--input", "holds no texts"]),
    (["--input", "{texts}", "--output", "missing-folder/top.jsonl"], ["--output", "does not exist; create it first"]),
    (["--input", "{texts}", "-k", "0"], ["-k", "must be >= 1"]),
    (["--input", "{texts}", "-k", "31"], ["-k", "31 exceeds the 30 labels"]),
    (["--model", "missing", "--input", "{texts}"], ["--model", "no folder 'missing'"]),
    (["--data", "{data}", "--split", "dev"], ["--split", "'dev' is not a split"]),
]


@pytest.mark.parametrize(
    "flags, fragments", PREDICT_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in PREDICT_USAGE_ERRORS]
)
def test_predict_usage_errors_leave_no_output(capsys, cli_files, tmp_path, flags, fragments):
    flags = [flag.format(**cli_files) for flag in flags]
    output = tmp_path / "top.jsonl"
    arguments = ["--model", cli_files["model"], "--output", output, *flags]
    status, lines = run_cli(capsys, ["predict", *arguments])
    assert_one_line_error(status, lines, 2, "predict", *fragments)
    assert not output.exists()


def test_predict_input_that_is_not_utf8_names_the_file_and_line(capsys, cli_files, tmp_path):
    texts = tmp_path / "latin1.txt"
    texts.write_bytes("w3 w40\nw7 caf\u00e9\n".encode("latin-1"))
    output = tmp_path / "top.jsonl"
    status, lines = run_cli(capsys, ["predict", "--model", cli_files["model"], "--input", texts, "--output", output])
    assert_one_line_error(
        status, lines, 2, "predict", "--input", f"{texts} line 2 is not UTF-8", "byte 0xe9 at column 7"
    )
    assert not output.exists()


def test_predict_with_non_finite_scores_fails_and_keeps_the_previous_output(capsys, cli_files, tmp_path):
    folder = tmp_path / "nan-model"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    tiny_tokenizer(folder)
    corrupt(folder, "output_layer.head.bias", lambda bias: bias.fill_(float("nan")))
    output = tmp_path / "top.jsonl"
    output.write_text("previous\n")
    status, lines = run_cli(capsys, ["predict", "--model", folder, "--input", cli_files["texts"], "--output", output])
    # The output layer refuses to rank NaN scores (in one process on the CPU; elsewhere predict checks them gathered).
    assert_one_line_error(status, lines, 1, "predict", "scores hold NaN", "the labels cannot be ranked")
    assert output.read_text() == "previous\n" and set(os.listdir(tmp_path)) == {"nan-model", "top.jsonl"}


def test_predict_writes_one_record_per_line_blank_lines_included(capsys, cli_files, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("w3 w40\n\nw7\n")
    output = tmp_path / "top.jsonl"
    status, _ = run_cli(
        capsys, ["predict", "--model", cli_files["model"], "--input", texts, "--output", output, "-k", "30"]
    )
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert status == 0 and len(records) == 3 and all(sorted(r["label_ids"]) == list(range(30)) for r in records)


def test_a_corrupt_model_is_a_one_line_library_error(capsys, cli_files, tmp_path):
    folder = tmp_path / "corrupt"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    tiny_tokenizer(folder)
    corrupt(folder, "output_layer.tail.supports", lambda supports: supports.__setitem__((0, 0), 1000))
    status, lines = run_cli(
        capsys, ["predict", "--model", folder, "--input", cli_files["texts"], "--output", tmp_path / "o.jsonl"]
    )
    assert_one_line_error(status, lines, 1, "predict", "tail supports", "outside [0, 32)")


def test_an_interrupted_save_is_a_one_line_library_error(capsys, cli_files, tmp_path):
    folder = tmp_path / "interrupted"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    (folder / INCOMPLETE_SAVE_FILE).write_text("{}")
    for command in (["evaluate", "--data", cli_files["data"]], ["push", "--repo-id", "user/model"]):
        status, lines = run_cli(capsys, [command[0], "--model", folder, *command[1:]])
        assert_one_line_error(status, lines, 1, command[0], "interrupted save")


GROUP_AND_PUSH_USAGE_ERRORS = [
    (["group", "--output", "missing-folder/grouping.safetensors"], ["--output", "does not exist"]),
    (["group", "--output", "g.safetensors", "--group-size", "0"], ["`group_size` must be >= 1"]),
    (["group", "--output", "g.safetensors", "--data", "missing"], ["`data`: no folder 'missing'"]),
    (["push", "--model", "missing", "--repo-id", "user/model"], ["--model", "no folder 'missing'"]),
    (["push", "--model", "{texts}", "--repo-id", "user/model"], ["--model", "(it is a file)"]),
    (["push", "--model", "{model}", "--repo-id", "user/a/b"], ["--repo-id", "not a Hub repository id"]),
    (["push", "--model", "{model}"], ["required: --repo-id"]),
]


@pytest.mark.parametrize(
    "argv, fragments", GROUP_AND_PUSH_USAGE_ERRORS, ids=[" ".join(argv) for argv, _ in GROUP_AND_PUSH_USAGE_ERRORS]
)
def test_group_and_push_usage_errors(capsys, cli_files, argv, fragments):
    argv = [arg.format(**cli_files) for arg in argv]
    status, lines = run_cli(capsys, argv)
    assert_one_line_error(status, lines, 2, argv[0], *fragments)


def test_pushing_a_folder_that_holds_no_model_is_a_one_line_library_error(capsys, tmp_path):
    status, lines = run_cli(capsys, ["push", "--model", tmp_path, "--repo-id", "user/model"])
    assert_one_line_error(status, lines, 1, "push", "has no config.json")


def test_no_command_is_a_one_line_error(capsys):
    status, lines = run_cli(capsys, [])
    assert status == 2 and len(lines) == 1 and "required: command" in lines[0]


# ------------------------------------------------------------------------------------------- the train command


def train_flags(data, encoder_dir, output_dir, *extra):
    return [
        "train",
        "--data",
        data,
        "--encoder",
        encoder_dir,
        "--output-dir",
        output_dir,
        "--max-length",
        "16",
        "--eval-batch-size",
        "16",
        "--batch-size",
        "16",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--epochs",
        "1",
        "--rewiring-interval",
        "0",
        *extra,
    ]


def test_training_into_a_folder_holding_a_model_is_refused_and_leaves_it_untouched(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))[0] == 0
    before = folder_state(output)
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))
    assert_one_line_error(
        status,
        lines,
        2,
        "train",
        "--output-dir",
        "already holds a model",
        "--overwrite-output-dir",
        "--resume-from-checkpoint",
    )
    assert folder_state(output) == before


def test_overwrite_output_dir_replaces_the_model_and_the_previous_runs_checkpoints(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--epochs", "2"))[0] == 0
    assert [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-6"]
    # A limit of 2 would keep the old run's checkpoint-6 beside the new checkpoint-3, were it not removed.
    status, _ = run_cli(
        capsys,
        train_flags(
            cli_files["data"],
            encoder_dir,
            output,
            *flags,
            "--overwrite-output-dir",
            "--fan-in",
            "4",
            "--save-total-limit",
            "2",
        ),
    )
    assert status == 0 and [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-3"]
    assert HasteForExtremeClassification.from_pretrained(output).config.fan_in == 4
    assert_no_leftovers(output)


def test_checkpoints_are_written_without_a_validation_split(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, "--validation-fraction", "0"))[0] == 0
    assert [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-3"]  # each epoch, the last kept
    assert checkpoint_is_complete(output / "checkpoint-3")


@pytest.mark.parametrize("strategy", ["steps", "no"])
def test_any_save_strategy_works_without_a_validation_split(capsys, cli_files, encoder_dir, tmp_path, strategy):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0", "--save-strategy", strategy, "--save-steps", "2")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags))[0] == 0
    assert sorted(path.name for path in output.glob("checkpoint-*")) == (
        ["checkpoint-3"] if strategy == "steps" else []
    )
    assert (output / "config.json").exists()


def test_resume_from_checkpoint_continues_the_run_past_a_half_written_checkpoint(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0", "--epochs", "2", "--logging-steps", "1")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--max-steps", "4"))[0] == 0
    killed = output / "checkpoint-6"
    killed.mkdir()
    (killed / "config.json").write_text("{}")
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--resume-from-checkpoint"))
    state = json.loads((output / "checkpoint-6" / "trainer_state.json").read_text())
    assert status == 0 and state["global_step"] == 6
    assert [log["step"] for log in state["log_history"] if "loss" in log][:4] == [1, 2, 3, 4]  # from the first run


def test_resume_from_a_named_incomplete_checkpoint_is_a_one_line_error(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    (output / "checkpoint-2").mkdir(parents=True)
    status, lines = run_cli(
        capsys, train_flags(cli_files["data"], encoder_dir, output, "--resume-from-checkpoint", output / "checkpoint-2")
    )
    assert_one_line_error(status, lines, 1, "train", "checkpoint-2 is not a complete checkpoint")


def test_resume_and_overwrite_together_are_refused(capsys, tmp_path):
    status, lines = run_cli(
        capsys, ["train", "--overwrite-output-dir", "--resume-from-checkpoint", "--output-dir", tmp_path]
    )
    assert_one_line_error(status, lines, 2, "train", "--overwrite-output-dir", "not both")


def test_a_failed_test_evaluation_keeps_the_trained_model(capsys, cli_files, encoder_dir, tmp_path, monkeypatch):
    import haste_hf.recipe

    def fail(*args, **kwargs):
        raise ValueError("evaluation failed")

    monkeypatch.setattr(haste_hf.recipe, "evaluate_split", fail)
    output = tmp_path / "out"
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))
    assert_one_line_error(status, lines, 1, "train", "evaluation failed")
    model = HasteForExtremeClassification.from_pretrained(output)
    assert model.config.label_count == CLI_LABELS and (output / "tokenizer_config.json").exists()
    assert (output / "README.md").exists() and not (output / "test_metrics.json").exists()
    assert_no_leftovers(output)


def test_a_dataset_of_fewer_labels_than_the_summary_k_trains_and_evaluates(capsys, encoder_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = planted_texts(3, 24, seed=0, labels_per_text=1)
    for name in ("trn.json", "tst.json"):
        (data / name).write_text(
            "".join(
                json.dumps({"uid": str(i), "title": r["text"], "target_ind": r["labels"]}) + "\n"
                for i, r in enumerate(rows)
            )
        )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(3)))
    output = tmp_path / "out"
    status, lines = run_cli(capsys, train_flags(data, encoder_dir, output, "--group-size", "2", "--fan-in", "4"))
    metrics = json.loads((output / "test_metrics.json").read_text())
    assert status == 0 and {"P@1", "P@3"} <= set(metrics) and "P@5" not in metrics


def test_data_without_any_positive_label_is_refused_before_the_encoder_loads(
    capsys, encoder_dir, tmp_path, monkeypatch
):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda name: pytest.fail("the encoder was loaded"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "trn.json").write_text(
        "".join(json.dumps({"uid": str(i), "title": f"w{i}", "target_ind": []}) + "\n" for i in range(8))
    )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(5)))
    status, lines = run_cli(capsys, train_flags(data, encoder_dir, tmp_path / "out"))
    assert_one_line_error(status, lines, 1, "train", "has no positive label")
    assert not (tmp_path / "out").exists()


def test_a_diverging_run_is_a_one_line_error_and_saves_no_final_model(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    status, lines = run_cli(
        capsys,
        train_flags(
            cli_files["data"],
            encoder_dir,
            output,
            "--lr",
            "1e8",
            "--output-lr",
            "1e8",
            "--validation-fraction",
            "0",
            "--epochs",
            "20",
        ),
    )
    # Stopped at the first non-finite gradient, or at a checkpoint of weights that already overflowed.
    assert_one_line_error(status, lines, 1, "train", "diverged", "on_non_finite")
    assert not (output / "config.json").exists()
    for checkpoint in output.glob("checkpoint-*"):
        assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())


@pytest.mark.parametrize("poisoned, skipped, steps", [({1, 2}, 2, 3), ({2}, 1, 3)])
def test_a_run_with_skipped_steps_reports_them_and_is_not_saved_when_most_were(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch, poisoned, skipped, steps
):
    import haste_hf.recipe

    build_model = haste_hf.recipe.build_model

    def poisoned_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        poison_encoder_output(model, calls=poisoned)  # training forward passes: no validation split
        return model

    monkeypatch.setattr(haste_hf.recipe, "build_model", poisoned_model)
    from haste_hf.cli import main

    output = tmp_path / "out"
    flags = train_flags(cli_files["data"], encoder_dir, output, "--on-non-finite", "skip", "--validation-fraction", "0")
    if 2 * skipped > steps:
        status, lines = run_cli(capsys, flags)
        assert_one_line_error(
            status, lines, 1, "train", f"{skipped} of its {steps} optimizer steps were skipped", "not saved"
        )
        assert not (output / "config.json").exists()
    else:
        assert main([str(flag) for flag in flags]) == 0
        assert f"steps: {steps} ({skipped} skipped: NaN or infinite gradients)" in capsys.readouterr().out
        assert (output / "config.json").exists()


@pytest.mark.parametrize("data", ["data40", "data20"])
def test_a_layout_of_another_label_count_is_refused_naming_both_counts(capsys, cli_files, encoder_dir, tmp_path, data):
    layout = tmp_path / "layout.safetensors"
    status, _ = run_cli(
        capsys,
        [
            "group",
            "--data",
            cli_files["data"],
            "--encoder",
            encoder_dir,
            "--output",
            layout,
            "--group-size",
            "4",
            "--grouping",
            "frequency",
            "--max-length",
            "16",
        ],
    )
    assert status == 0
    status, lines = run_cli(
        capsys, train_flags(cli_files[data], encoder_dir, tmp_path / "out", "--layout-file", layout)
    )
    count = data.removeprefix("data")
    assert_one_line_error(
        status, lines, 1, "train", f"layout is of 30 labels and the dataset has {count}", "haste-hf group"
    )
    assert not (tmp_path / "out").exists()


def test_the_demo_replaces_its_own_folder_and_train_does_not():
    from haste_hf.cli import build_parser

    assert build_parser(command="demo").parse_args(["demo"]).overwrite_output_dir is True
    assert build_parser(command="train").parse_args(["train"]).overwrite_output_dir is False


def test_a_config_file_that_does_not_parse_is_a_one_line_error(capsys, tmp_path):
    for name, text in (("run.yaml", "learning_rate: [1\n"), ("run.json", "{learning_rate: 1}")):
        (tmp_path / name).write_text(text)
        status, lines = run_cli(capsys, ["train", "--config", tmp_path / name])
        assert_one_line_error(status, lines, 2, "train", "--config", "is not valid")


CONFIG_FILE_ERRORS = [
    (
        "run.yaml",
        "learning_rate: 1.0e-4\nfan_in: 8\nlearning_rate: 1.0e-3\n",
        ["key 'learning_rate' is given twice (line 3)"],
    ),
    ("run.json", '{"learning_rate": 1e-4, "learning_rate": 1e-3}', ["key 'learning_rate' is given twice"]),
    (
        "run.yaml",
        "learning-rate: 1.0e-4\nlearning_rate: 1.0e-3\n",
        ["'learning_rate' is given twice (as 'learning_rate' too)"],
    ),
    ("run.yaml", "per_device_train_batch_size: null\n", ["'per_device_train_batch_size' is null"]),
    ("run.yaml", "fan_in: 6.7\n", ["'fan_in' must be an integer, got 6.7"]),
    ("run.json", '{"max_steps": 2.5}', ["'max_steps' must be an integer, got 2.5"]),
    ("run.json", '{"seed": true}', ["'seed' must be an integer, got True"]),
    ("run.yaml", "learning_rate: fast\n", ["'learning_rate' must be a number, got 'fast'"]),
    ("run.yaml", "fan_in: '6.7'\n", ["'fan_in' must be an integer, got '6.7'"]),
    ("run.yaml", "bf16: 1.5\n", ["'bf16' must be true or false, got 1.5"]),
    ("run.yaml", "grouping: kmeans\n", ["'grouping' must be one of semantic, frequency, random, got 'kmeans'"]),
    ("run.yaml", "1: 2\n", ["key 1 is not a flag name"]),
]


@pytest.mark.parametrize("name, text, fragments", CONFIG_FILE_ERRORS, ids=[text for _, text, _ in CONFIG_FILE_ERRORS])
def test_config_file_values_are_checked_naming_the_key(capsys, monkeypatch, tmp_path, name, text, fragments):
    import haste_hf.cli

    monkeypatch.setattr(haste_hf.cli, "command_train", lambda args: pytest.fail("the command ran"))
    (tmp_path / name).write_text(text)
    status, lines = run_cli(capsys, ["train", "--config", tmp_path / name])
    assert_one_line_error(status, lines, 2, "train", "--config", *fragments)


def test_config_file_values_of_the_right_type_are_taken(tmp_path):
    from haste_hf.cli import parse_args

    (tmp_path / "run.yaml").write_text(
        "group_size: null\nfan_in: 8\nlearning_rate: 1e-4\nwarmup_steps: 3\neval_steps: 0.5\n"
        "bf16: false\ngrouping: random\nreport_to: [none]\n"
    )
    args = parse_args(["train", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(tmp_path / "out")])
    assert (args.recipe.group_size, args.recipe.fan_in, args.recipe.grouping) == (None, 8, "random")
    assert (args.training.learning_rate, args.training.warmup_steps, args.training.bf16) == (1e-4, 3, False)
