"""`activation_checkpointing` (transformers 5.24's name of `gradient_checkpointing`, which the README recommends) works
on every transformers version the package admits, without a deprecation warning."""

import re
import warnings
from pathlib import Path

from datasets import Dataset
from tiny_encoders import planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_trainer

from haste_hf.cli.parser import build_parser


README = (Path(__file__).parents[2] / "README.md").read_text()


def test_the_readme_recommends_the_current_name():
    assert "`--activation_checkpointing`" in README
    assert not re.search(r"(?<!transformers' )`--gradient_checkpointing`", README)


def test_activation_checkpointing_trains_with_checkpointing_on(tmp_path):
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        trainer = make_tiny_trainer(
            tmp_path / "out",
            tiny_tokenizer(tmp_path / "tokenizer"),
            Dataset.from_list(planted_texts(40, 16)),
            activation_checkpointing=True,
            max_steps=1,
            per_device_train_batch_size=8,
        )
        trainer.train()
    assert trainer.model.is_gradient_checkpointing


def test_the_command_line_takes_the_flag():
    parser = build_parser(command="train", live=False)
    arguments = parser.parse_args(["train", "--activation-checkpointing", "--data", "d", "--output-dir", "o"])
    assert arguments.activation_checkpointing is True


def test_the_old_name_of_this_class_and_the_command_line_is_taken_without_a_warning(tmp_path):
    """`HasteTrainingArguments` declares `gradient_checkpointing` itself (the CLI's `--gradient-checkpointing`): on a
    transformers that renamed it, the value goes on under the new name, with no warning naming a flag the CLI lacks."""
    from haste_hf import HasteTrainingArguments
    from haste_hf.training.training_args import HAS_ACTIVATION_CHECKPOINTING

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        args = HasteTrainingArguments(
            output_dir=str(tmp_path), gradient_checkpointing=True, gradient_checkpointing_kwargs={"every_n_layers": 2}
        )
    assert args.gradient_checkpointing is True and args.gradient_checkpointing_kwargs == {"every_n_layers": 2}
    assert args._checkpointing_given
    if HAS_ACTIVATION_CHECKPOINTING:  # the name transformers reads there
        assert args.activation_checkpointing is True
