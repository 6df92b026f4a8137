# Saved `training_args.bin` files name this module: it stays, and serves the class from its new home.
from .training.training_args import HasteTrainingArguments  # noqa: F401
