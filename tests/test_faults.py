"""Bad inputs and faults: each case asserts a clear error (naming the argument, file or count at fault)
or the correct result, and that no half-written output is left behind.

Sections: saving and loading; training divergence; labels and data; the command line."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file, save_file
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
from transformers import TrainerCallback as TrainerCallbackBase

import haste_hf.hub
from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.data import XMCDataCollator
from haste_hf.modeling_haste import INCOMPLETE_SAVE_FILE, STAGING_PREFIX, save_folder_atomically
from haste_hf.trainer import HasteTrainer
from haste_hf.training_args import HasteTrainingArguments


LABELS = 40


def make_model(seed=0, **overrides):
    fields = dict(
        encoder=tiny_encoder_config("bert"), label_count=LABELS, head_label_count=4, group_size=4, fan_in=8, supports_seed=seed
    )  # fmt: skip
    fields.update(overrides)
    torch.manual_seed(seed)
    return HasteForExtremeClassification(HasteConfig(**fields))


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


def test_save_into_a_writable_folder_under_a_read_only_parent(tmp_path):
    target = tmp_path / "volume" / "model"
    target.mkdir(parents=True)
    os.chmod(tmp_path / "volume", stat.S_IRUSR | stat.S_IXUSR)
    try:
        model = make_model()
        model.save_pretrained(target)
        model.save_pretrained(target)  # and again over the first save
    finally:
        os.chmod(tmp_path / "volume", stat.S_IRWXU)
    assert_no_leftovers(target)
    assert torch.equal(HasteForExtremeClassification.from_pretrained(target).tail.weight, model.tail.weight)


def test_failed_write_leaves_the_previous_save_and_no_staging(tmp_path):
    make_model(seed=0).save_pretrained(tmp_path)
    before = folder_state(tmp_path)

    def write(staging):
        open(os.path.join(staging, "config.json"), "w").write("{}")
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


@pytest.mark.parametrize("where", ["tail.weight", "head.bias", "encoder.embeddings.word_embeddings.weight"])
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
        model.tail.weight.fill_(1e30)  # the squared norm overflows; the values do not
    model.save_pretrained(tmp_path)
    assert HasteForExtremeClassification.from_pretrained(tmp_path).tail.weight.max() == 1e30


def corrupt(folder, name, change):
    tensors = load_file(folder / "model.safetensors")
    change(tensors[name])
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("tail.supports", lambda t: t.__setitem__((0, 0), 32), "outside \\[0, 32\\)"),
        ("tail.supports", lambda t: t.__setitem__((2, 1), -5), "outside \\[0, 32\\)"),
        ("tail.supports", lambda t: t.__setitem__((1, 1), t[1, 0]), "group 1 lists a feature twice"),
        ("output_labels", lambda t: t.__setitem__(0, t[1]), "each of the 40 labels exactly once"),
        ("output_labels", lambda t: t.__setitem__(5, 40), "each of the 40 labels exactly once"),
        ("output_labels", lambda t: t.__setitem__(5, -7), "each of the 40 labels exactly once"),
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


def make_trainer(output_dir, tokenizer, train_set, model=None, **overrides):
    fields = dict(
        output_dir=str(output_dir), per_device_train_batch_size=8, max_steps=6, save_strategy="no", logging_steps=1,
        learning_rate=1e-3, output_learning_rate=0.1, rewiring_interval=0, report_to=[], seed=0, use_cpu=True,
        disable_tqdm=True,
    )  # fmt: skip
    fields.update(overrides)
    return HasteTrainer(
        model=model if model is not None else make_model(),
        args=HasteTrainingArguments(**fields),
        train_dataset=train_set,
        data_collator=XMCDataCollator(tokenizer, max_length=16),
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
        tmp_path, tokenizer, train_set, learning_rate=1e6, output_learning_rate=1e6, max_steps=30, save_strategy="steps",
        save_steps=1, max_grad_norm=0.0,
    )  # fmt: skip
    with pytest.raises(FloatingPointError, match="diverged at step"):
        trainer.train()
    for checkpoint in tmp_path.glob("checkpoint-*"):
        if (checkpoint / "model.safetensors").exists():
            HasteForExtremeClassification.from_pretrained(checkpoint)  # every checkpoint saved is finite
            assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())


def test_skipping_cannot_recover_non_finite_weights(tmp_path, tokenizer, train_set):
    model = make_model()
    with torch.no_grad():
        model.tail.weight[0, 0, 0] = float("inf")
    trainer = make_trainer(tmp_path, tokenizer, train_set, model=model, on_non_finite="skip")
    with pytest.raises(FloatingPointError, match="weights themselves"):
        trainer.train()


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
        (torch.zeros(3, LABELS, dtype=torch.uint8), "dtype torch.uint8 cannot hold the -100 padding"),
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


def test_labels_as_int8_ids_bool_or_soft_targets_in_range_give_the_right_loss():
    model = make_model().eval()
    input_ids, attention_mask = batch(model)
    ids = torch.tensor([[1, 2], [3, -100], [5, 39]])
    dense = torch.zeros(3, LABELS)
    dense[[0, 0, 1, 2, 2], [1, 2, 3, 5, 39]] = 1.0
    reference = model(input_ids, attention_mask, labels=ids).loss
    for labels in (ids.to(torch.int8), ids.to(torch.int32), dense.bool(), dense):
        assert torch.allclose(model(input_ids, attention_mask, labels=labels).loss, reference)
    soft = dense * 0.5
    logits = model(input_ids, attention_mask).logits
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, soft, reduction="sum") / 3
    assert torch.allclose(model(input_ids, attention_mask, labels=soft).loss, expected, rtol=1e-5)


def test_semantic_grouping_of_labels_without_any_positive_keeps_them_all():
    from haste_hf.grouping import group_labels

    grouping = group_labels(torch.zeros(LABELS, 8), torch.arange(4, LABELS), 4, "semantic", device="cpu")
    assert sorted(grouping.order.tolist()) == list(range(4, LABELS))
