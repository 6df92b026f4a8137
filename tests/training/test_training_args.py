"""`HasteTrainingArguments`' own checks (`haste_hf.training.training_args`): counts and rates out of range are
refused naming the field, at their bounds they pass."""

import pytest

from haste_hf.training.training_args import HasteTrainingArguments


@pytest.mark.parametrize(
    "name", ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"]
)
def test_a_count_below_one_is_refused_and_one_passes(tmp_path, name):
    with pytest.raises(ValueError, match=rf"^`{name}` must be >= 1, got 0\.$"):
        HasteTrainingArguments(output_dir=str(tmp_path), **{name: 0})
    assert getattr(HasteTrainingArguments(output_dir=str(tmp_path), **{name: 1}), name) == 1


@pytest.mark.parametrize("name", ["learning_rate", "weight_decay", "dataloader_num_workers"])
def test_a_negative_rate_or_worker_count_is_refused_and_zero_passes(tmp_path, name):
    with pytest.raises(ValueError, match=rf"^`{name}` must be >= 0, got -1\.$"):
        HasteTrainingArguments(output_dir=str(tmp_path), **{name: -1})
    assert getattr(HasteTrainingArguments(output_dir=str(tmp_path), **{name: 0}), name) == 0
