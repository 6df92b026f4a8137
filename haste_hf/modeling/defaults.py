# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The defaults and shared constants of a run (tokens per text, batch sizes, the training recipe, the padding of
label-id lists), in one place that imports nothing but the standard library: the command line reads them before
transformers or torch loads, the trainer's arguments and the data code read them after, so no number is repeated;
`tests/test_defaults.py` pins each. The defaults of the model's structure (G, F, the head's share, pooling, loss)
are the configuration's own, in `configuration_haste.py`, which imports no sibling (see there why).

Exported with the model's code: `label_positions.py` reads the padding id.
"""

# Tokens per text, and texts per batch where no gradient is kept (evaluation, prediction, label embeddings).
DEFAULT_MAX_LENGTH = 128
DEFAULT_EVAL_BATCH_SIZE = 64
# The padding value of positive label-id lists (`[B, P]`), as Hugging Face's `-100` ignore index.
LABEL_PADDING_ID = -100

# The default training recipe (`benchmarks/recipe_study.py`).
DEFAULT_LEARNING_RATE = 2e-4
DEFAULT_OUTPUT_LEARNING_RATE = 0.4
DEFAULT_EPOCHS = 10.0
DEFAULT_BATCH_SIZE = 128
# The sparse tail (issue 39, `benchmarks/results/tail_study/`): the tail's SGD rate as a multiple of the head's (1: one
# parameter group for head and tail, as checkpoints before this default), a bias per tail label (as the dense head's
# labels have), and the output layer started from the label texts' embeddings where the data has label texts (the
# fallback, random rows, where it has none). Together on `deps`: PSP@5 26.01 -> 28.95 (2 seeds, tail_study/tables.md).
DEFAULT_TAIL_LR_SCALE = 2.0
DEFAULT_TAIL_BIAS = True
DEFAULT_INIT_FROM_LABEL_TEXTS = True

# `resume_from_checkpoint` value (and `haste-hf train --resume-from-checkpoint` alone): the output folder's last
# complete checkpoint.
LAST_CHECKPOINT = "last"
