"""A run resumed from the checkpoint of its last step ends there: transformers checks `max_steps` only after a
step, so a run that had finished mid-epoch (the way back after a failed final save) trained one step more."""

import os

import torch
from datasets import Dataset
from tiny_encoders import planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_trainer
from transformers.trainer_utils import get_last_checkpoint


LABELS = 40


def test_a_run_resumed_at_its_last_step_trains_no_further(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    train = Dataset.from_list(planted_texts(LABELS, 32, seed=0))  # 4 steps an epoch: step 6 is mid-epoch
    arguments = dict(
        model_fields=dict(label_count=LABELS),
        per_device_train_batch_size=8,
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
        lr_scheduler_type="constant",  # any further step moves the weights
        rewiring_interval=None,
    )
    finished = make_tiny_trainer(tmp_path / "run", tokenizer, train, **arguments)
    finished.train()
    assert get_last_checkpoint(tmp_path / "run").endswith("checkpoint-6")
    weights = {name: tensor.clone() for name, tensor in finished.model.state_dict().items()}

    resumed = make_tiny_trainer(tmp_path / "run", tokenizer, train, **arguments)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6
    assert not os.path.exists(tmp_path / "run" / "checkpoint-7")
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
