# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Every default and shared constant of HASTE, in one place that imports nothing but the standard library (and
transformers only where it runs as remote code, below).

The model's configuration and output layer, the trainer's arguments and the command line read these values
(the command line before transformers or torch loads), so no number is repeated; `tests/test_defaults.py`
pins each. Exported with the model's code: a checkpoint folder carries it beside `configuration_haste.py`.

Loaded as remote code (`transformers_modules.*`), it also quiets transformers' notice of downloaded code for the
model's own files (`_RepeatedCodeNotice`): it is the first of the model's files to run.
"""

import logging
import math
import os
import re


POOLING_MODES = ("cls", "mean", "last_token")
# The paper models the top 2-5% most frequent labels densely ("Head-Tail Split"); every entry point defaults
# to this share.
DEFAULT_HEAD_LABEL_FRACTION = 0.03
# Labels per tail group G and features per group F (the paper: G in {16, 32, 64}, F = 64; `benchmarks/recipe_study.py`:
# F = 128 of MiniLM's 384 features beat 64 on both real datasets, G = 8 did not beat 16).
DEFAULT_GROUP_SIZE = 16
DEFAULT_FAN_IN = 128
# Tokens per text, and texts per batch where no gradient is kept (evaluation, prediction, label embeddings).
DEFAULT_MAX_LENGTH = 128
DEFAULT_EVAL_BATCH_SIZE = 64
# The padding value of positive label-id lists (`[B, P]`), as Hugging Face's `-100` ignore index.
LABEL_PADDING_ID = -100
LOSS_REDUCTIONS = ("sum", "mean")
# The names of `haste_hf.modeling.losses.LOSSES` (the configuration reads them without importing torch).
LOSSES = ("bce", "squared_hinge")

# The default training recipe (`benchmarks/recipe_study.py`).
DEFAULT_LEARNING_RATE = 2e-4
DEFAULT_OUTPUT_LEARNING_RATE = 0.4
DEFAULT_EPOCHS = 10.0
DEFAULT_BATCH_SIZE = 128

# `resume_from_checkpoint` value (and `haste-hf train --resume-from-checkpoint` alone): the output folder's last
# complete checkpoint.
LAST_CHECKPOINT = "last"


def head_label_count_for(head_label_fraction: float, label_count: int) -> int:
    """The head size of a share of `label_count` labels, rounded half up (0.03 of 450 labels: 14)."""
    return math.floor(float(head_label_fraction) * label_count + 0.5)


def check_one_of(name: str, value, choices: tuple) -> None:
    """The check the configuration and the output layer share for `pooling`, `loss` and `loss_reduction`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


class _RepeatedCodeNotice(logging.Filter):
    """Drops transformers' notice that code files were downloaded ("A new version of the following files was
    downloaded from <repository>") where the repository is the one this module was loaded from as remote code and
    every file listed lies beside this module. The configuration's files (`configuration_haste` and this one) were announced
    before any of them ran; the model's files, fetched next from the same repository and revision, would add one
    notice of 3 to 14 lines for each of its 16 files."""

    NOTICE = "A new version of the following files was downloaded from https://huggingface.co/"

    def __init__(self, folder: str, sanitize):
        super().__init__()
        self.folder, self.sanitize = folder, sanitize

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.NOTICE) or ":\n" not in message:
            return True
        repository = message[len(self.NOTICE) : message.index(":\n")]
        files = re.findall(r"^- (.+)$", message, flags=re.MULTILINE)
        here = os.path.dirname(self.folder).endswith(os.sep + os.sep.join(map(self.sanitize, repository.split("/"))))
        return not (here and files and all(os.path.isfile(os.path.join(self.folder, name)) for name in files))


if __name__.startswith("transformers_modules."):  # loaded as remote code (see `_RepeatedCodeNotice`)
    from transformers import dynamic_module_utils

    if hasattr(dynamic_module_utils, "_sanitize_module_name"):
        logging.getLogger(dynamic_module_utils.__name__).addFilter(
            _RepeatedCodeNotice(os.path.dirname(os.path.abspath(__file__)), dynamic_module_utils._sanitize_module_name)
        )
