"""Training divergence: non-finite losses and weights stop or skip steps as asked, never saved; resuming
passes over half-written checkpoints."""

import json
import shutil
from functools import partial

import pytest
import torch
from datasets import Dataset
from faults import LABELS, make_model, poison_encoder_output
from safetensors.torch import load_file
from tiny_encoders import planted_texts
from tiny_haste import make_tiny_trainer
from transformers import TrainerCallback as TrainerCallbackBase

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import (
    INCOMPLETE_SAVE_FILE,
    checkpoint_is_complete,
    last_complete_checkpoint,
)
from haste_hf.training.training_args import HasteTrainingArguments


# ------------------------------------------------------------------------------------------- divergence


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
