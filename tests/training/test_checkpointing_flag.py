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
