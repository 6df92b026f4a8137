# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Training a HASTE model: the trainer and its arguments, callbacks, the two optimizers, the label-sharded output
layer and its collectives, PEFT support, and the run folder's owner (`run_folder`) with its lock."""
