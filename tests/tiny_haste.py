"""Tiny HASTE models and trainers for tests, built offline on the random encoders of `tiny_encoders`.

A plain module, not fixtures in conftest.py: the torchrun scripts (`distributed_train.py`) build the same
models, and importing conftest.py would start a second test Hub. A test file that trains or builds models
with settings of its own binds them once with `functools.partial` rather than copying these functions.
"""

import torch
from tiny_encoders import tiny_encoder_config

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.data import XMCDataCollator
from haste_hf.modeling.output_layer import output_labels_from_frequencies
from haste_hf.training.trainer import HasteTrainer
from haste_hf.training.training_args import HasteTrainingArguments


def make_tiny_model(
    label_count=40,
    head_label_count=4,
    group_size=4,
    fan_in=8,
    encoder="bert",
    seed=0,
    shuffle_labels=False,
    training=True,
    **fields,
) -> HasteForExtremeClassification:
    """A HASTE model over a tiny random encoder (a `tiny_encoders` family name, or an encoder config).

    `seed` draws everything: the weights (`torch.manual_seed`) and the tail's supports (`supports_seed`).
    `shuffle_labels`: a random label frequency order, drawn after the weights, so that the head and the tail
    hold scattered label ids. `training=False`: in eval mode (no dropout), as inference tests compare it.
    Other `HasteConfig` fields go in `fields`.
    """
    config = HasteConfig(
        encoder=tiny_encoder_config(encoder) if isinstance(encoder, str) else encoder,
        label_count=label_count,
        head_label_count=head_label_count,
        group_size=group_size,
        fan_in=fan_in,
        supports_seed=seed,
        **fields,
    )
    torch.manual_seed(seed)
    model = HasteForExtremeClassification(config)
    if shuffle_labels:
        model.output_layer.set_output_labels_(output_labels_from_frequencies(config, torch.randperm(label_count)))
    return model.train(training)


def make_tiny_trainer(
    output_dir,
    tokenizer,
    train_dataset,
    model=None,
    *,
    model_fields=None,
    eval_dataset=None,
    data_collator=None,
    compute_metrics=None,
    callbacks=None,
    processing_class=None,
    **training,
) -> HasteTrainer:
    """A `HasteTrainer` on CPU, seeded, silent, reporting nowhere; `training` sets any other
    `HasteTrainingArguments` field (and overrides these). `model` defaults to a fresh
    `make_tiny_model(**model_fields)`; the collator to `XMCDataCollator(tokenizer, max_length=16)`; the trainer
    saves `processing_class` (None: nothing) with its checkpoints."""
    arguments = dict(output_dir=str(output_dir), report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    arguments.update(training)
    return HasteTrainer(
        model=model if model is not None else make_tiny_model(**(model_fields or {})),
        args=HasteTrainingArguments(**arguments),
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        data_collator=data_collator or XMCDataCollator(tokenizer, max_length=16),
        compute_metrics=compute_metrics,
        callbacks=callbacks,
        processing_class=processing_class,
    )
