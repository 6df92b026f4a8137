# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The training recipe, written once: data -> validation hold-out -> label layout (frequencies, head/tail split,
label embeddings, groups) -> model -> `HasteTrainer` -> saved folder -> test metrics.

    from haste_hf.recipe import train

    run = train("LF-AmazonTitles-131K/", "sentence-transformers/all-MiniLM-L6-v2", output_dir="out",
                group_size=32, training_args={"num_train_epochs": 5, "per_device_train_batch_size": 128})
    run.test_metrics["P@1"]

The `haste-hf train` command, the examples and `benchmarks/real_data.py` call `train`; its steps
(`load_dataset`, `split_validation`, `build_layout`, `build_model`, `build_trainer`, `evaluate_split`,
`save_trained`) are public for scripts that change one of them.
"""

import copy
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers.trainer_utils import IntervalStrategy, set_seed

from .encoders import check_max_length, encoder_pooling, load_encoder
from .evaluation import (
    EVALUATION_SETTINGS,
    EVALUATION_SETTINGS_FILE,
    evaluate_split,
    predict_top_k,
    process_rank_and_count,
    saved_evaluation_settings,
)
from .labels.layout import LabelLayout
from .metrics import DEFAULT_KS
from .model_card import CardFields, write_results
from .modeling.configuration_haste import DEFAULT_FAN_IN, DEFAULT_GROUP_SIZE
from .modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH, LAST_CHECKPOINT
from .modeling.logging_utils import get_logger
from .modeling.model_sources import DEMO_ENCODER, encoder_model_id, resolve_encoder
from .modeling.modeling_haste import encoder_token_limit  # noqa: F401 (re-exported: `haste-hf` imports it from here)
from .modeling.saving import last_complete_checkpoint
from .recipe_arguments import DEFAULT_BETA, DEFAULT_GROUPING, DEMO_DATASET_NAME, RecipeArguments, label_texts_for
from .training.run_folder import RunFolder, check_output_dir


logger = get_logger(__name__)


@dataclass
class TrainingRun:
    """What `train` returns: the trained model and everything that went into it."""

    model: Any
    tokenizer: Any
    layout: LabelLayout
    trainer: Any
    test_metrics: dict[str, float]
    propensity: Any
    training_seconds: float
    output_dir: str | None


# ------------------------------------------------------------------------------------------------ steps


def load_dataset(data, format: str = "auto", text_fields: str | None = None, label_texts=False, label_text_share=None):
    """An `XMCDataset` from a folder, or the embedded demo set when `data` is None; `label_text_share` as
    `load_xmc_dataset` takes it."""
    from .data import demo_dataset_path, detect_format, load_xmc_dataset

    path = data if data is not None else demo_dataset_path()
    if (detect_format(path) if format == "auto" else format) in ("bow", "bow_split"):
        raise ValueError(
            f"{path} is a bag-of-words dataset (feature ids, no texts), and HASTE models read texts through their "
            "encoder: use the dataset's raw-text release (e.g. LF-AmazonTitles-131K)."
        )
    return load_xmc_dataset(
        path,
        format=format,
        text_fields=resolved_text_fields(data, text_fields),
        add_label_texts=label_texts,
        label_text_share=label_text_share,
    )


def resolved_text_fields(data, text_fields: str | None) -> str:
    """The text of a JSON-lines instance that `load_dataset` reads: `text_fields`, or by default the title (title +
    content for the embedded demo set)."""
    return text_fields or ("title_content" if data is None else "title")


def dataset_name_of(data, dataset_name: str | None = None) -> str:
    if dataset_name:
        return dataset_name
    return Path(data).name if isinstance(data, (str, os.PathLike)) else DEMO_DATASET_NAME


def split_validation(train_split, validation_fraction: float, seed: int):
    """`(train, validation)`: a seeded hold-out of the training split, or `(train, None)` for a fraction of 0.

    `haste-hf group` and `haste-hf train` both call this, so a layout computed ahead of training describes the
    exact split the model trains on.
    """
    if validation_fraction <= 0:
        return train_split, None
    parts = train_split.train_test_split(test_size=validation_fraction, seed=seed)
    return parts["train"], parts["test"]


def propensity_of(data, dataset_name: str, a: float | None = None, b: float | None = None):
    """Propensities from the whole training file (as `haste-hf evaluate` computes them, so both agree)."""
    from .metrics import Propensity

    return Propensity.from_frequencies(
        data.train_label_frequencies, data.num_train_points, dataset_name=dataset_name, a=a, b=b
    )


def build_layout(
    train_split,
    label_count: int,
    encoder=None,
    tokenizer=None,
    *,
    layout: "LabelLayout | str | os.PathLike | None" = None,
    group_size: int | None = None,
    head_label_fraction: float | None = None,
    grouping: str | None = None,
    beta: float | None = None,
    pooling: str | None = None,
    seed: int = 0,
    max_length: int = DEFAULT_MAX_LENGTH,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    label_texts=None,
    label_text_grouping_below: int = 0,
    frequency_bands=None,
) -> LabelLayout:
    """The label layout of `train_split`.

    A given `layout` (object or file) is checked against the split and against the structure options given
    (None: take the layout's); otherwise it is computed with those options (None: the defaults), the labels with
    fewer than `label_text_grouping_below` training points grouped by their `label_texts` too, and the tail grouped
    within the bands of training count `frequency_bands` (`group_labels`).
    """
    if layout is not None:
        if not isinstance(layout, LabelLayout):
            layout = LabelLayout.load(layout)
        if layout.label_count != label_count:
            raise ValueError(
                f"The label layout is of {layout.label_count:,} labels and the dataset has {label_count:,}: compute the "
                "layout from this dataset (`haste-hf group` with the same --data, --validation-fraction and --seed)."
            )
        if label_text_grouping_below:
            raise ValueError(
                "`label_text_grouping_below` shapes the groups, which the given label layout holds already: leave one "
                "out (`haste-hf group` takes --label-text-grouping-below)."
            )
        layout.check_split(train_split)
        layout.check_options(
            group_size=group_size,
            head_label_fraction=head_label_fraction,
            strategy=grouping,
            frequency_bands=frequency_bands,
        )
        if beta is not None:
            logger.warning("`beta` is ignored: the label layout's groups are already formed.")
        return layout
    return LabelLayout.from_training_split(
        train_split,
        label_count,
        group_size or DEFAULT_GROUP_SIZE,
        head_label_fraction=head_label_fraction,
        strategy=grouping or DEFAULT_GROUPING,
        encoder=encoder,
        tokenizer=tokenizer,
        pooling=pooling,
        max_length=max_length,
        batch_size=batch_size,
        beta=DEFAULT_BETA if beta is None else beta,
        seed=seed,
        label_texts=label_texts,
        label_text_grouping_below=label_text_grouping_below,
        frequency_bands=frequency_bands,
    )


def build_model(
    encoder,
    layout: LabelLayout,
    *,
    label_count: int | None = None,
    label_names=None,
    fan_in: int = DEFAULT_FAN_IN,
    pooling: str | None = None,
    head_projection_dim: int | None = None,
    tail_projection_dim: int | None = None,
    tail_bias: bool = False,
):
    """A new model around `encoder` with `layout`'s head and tail (checked against `label_count`, the data's)."""
    from .modeling.modeling_haste import HasteForExtremeClassification

    return HasteForExtremeClassification.from_encoder_pretrained(
        encoder,
        label_count,
        layout=layout,
        label_names=label_names,
        fan_in=fan_in,
        pooling=pooling,
        head_projection_dim=head_projection_dim,
        tail_projection_dim=tail_projection_dim,
        tail_bias=tail_bias,
    )


def model_selection_arguments(has_validation: bool, eval_steps: int | None = None) -> dict:
    """Checkpoint each epoch (or every `eval_steps`), so that a run can be resumed; with a validation split,
    evaluate on it at the same times and keep the best P@1."""
    strategy = "steps" if eval_steps else "epoch"
    return dict(
        eval_strategy=strategy if has_validation else "no",
        save_strategy=strategy,
        eval_steps=eval_steps,
        save_steps=eval_steps,
        load_best_model_at_end=has_validation,
        metric_for_best_model="P@1" if has_validation else None,
        greater_is_better=True if has_validation else None,
        save_total_limit=1,
    )


def build_trainer(
    model, tokenizer, training_args, train_split, validation_split, propensity, max_length: int, callbacks=None
):
    from .data import XMCDataCollator
    from .metrics import make_compute_metrics
    from .training.trainer import HasteTrainer

    return HasteTrainer(
        model=model,
        args=training_args,
        train_dataset=train_split,
        eval_dataset=validation_split,
        data_collator=XMCDataCollator(tokenizer, max_length=max_length, label_count=model.config.label_count),
        compute_metrics=make_compute_metrics(
            ks=[k for k in DEFAULT_KS if k <= model.config.label_count], propensity=propensity
        ),
        callbacks=callbacks,
    )


def save_trained(
    trainer,
    tokenizer,
    layout: LabelLayout,
    output_dir: str,
    card: CardFields,
    *,
    evaluation_settings: dict | None = None,
) -> None:
    """The model, its tokenizer (whose `model_max_length` is the training length), its training arguments, its
    model card and the settings its test metrics are computed with, switched into `output_dir` at once
    (`RunFolder.save_trained`); `test_metrics.json` too unless `card.test_metrics` is None (not computed yet).
    Checkpoints and logs in `output_dir` stay."""

    def write_extra(folder: Path):
        if evaluation_settings is not None:
            (folder / EVALUATION_SETTINGS_FILE).write_text(json.dumps(evaluation_settings, indent=2))
        write_results(folder, trainer, layout, output_dir, card)

    RunFolder(output_dir).save_trained(trainer, tokenizer, write_extra)


# ------------------------------------------------------------------------------------------------ the recipe


def _training_arguments(training_args, output_dir: str | None, has_validation: bool):
    """`training_args` as `HasteTrainingArguments` fitted to the run: a dict is completed with the recipe's
    defaults; evaluation is turned off without a validation split; the recipe pushes the final folder itself."""
    from .training.training_args import HasteTrainingArguments

    if not isinstance(training_args, HasteTrainingArguments):
        overrides = dict(training_args or {})
        defaults = dict(
            output_dir=output_dir or "haste-model",
            **model_selection_arguments(has_validation, overrides.get("eval_steps")),
        )
        training_args = HasteTrainingArguments(**{**defaults, **overrides})
    else:
        training_args = copy.deepcopy(training_args)
    if output_dir is not None:
        training_args.output_dir = output_dir
    if not has_validation and training_args.eval_strategy != "no":
        logger.info(
            "No validation split (validation_fraction=0): evaluation during training and best-model selection are off."
        )
        training_args.eval_strategy = IntervalStrategy.NO
        training_args.load_best_model_at_end = False
    push = training_args.push_to_hub
    training_args.push_to_hub = False  # the Trainer would push checkpoints without the test metrics and card
    return training_args, push


def _check_process_group(training_args) -> None:
    """Launched as several processes, the `HasteTrainingArguments` have made them one data-parallel run by now;
    where they have not (CPUs without `use_cpu`), each process would train alone on all the data."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes > 1 and training_args.world_size != processes:
        # A ValueError, which the command line reports in one line per process rather than a traceback each.
        raise ValueError(
            f"Launched as {processes} processes, but the Trainer sees {training_args.world_size}: each would train "
            "alone. On CPUs pass `--use_cpu` (`use_cpu=True`); on GPUs launch with torchrun or `accelerate launch --multi_gpu`."
        )


def _recipe_arguments(data, encoder: str, recipe_args: RecipeArguments | None, options: dict) -> RecipeArguments:
    """`recipe_args`, or the `RecipeArguments` of `train`'s keywords (not both)."""
    if recipe_args is None:
        path = os.fspath(data) if isinstance(data, (str, os.PathLike)) else None
        return RecipeArguments(data=path, encoder=encoder, **options)
    if options:
        raise ValueError(
            f"Give the recipe's options in `recipe_args` or as keywords, not both (got {sorted(options)})."
        )
    return recipe_args


def _run_arguments(training_args, output_dir: str | None, recipe: RecipeArguments, save: bool, resume_from_checkpoint):
    """`(training_args, push, resume_from_checkpoint)` of the run (see `_training_arguments`), checked against its
    processes and `save`; resuming: the argument, else the training arguments'; `"last"` reads as True."""
    training_args, push = _training_arguments(training_args, output_dir, recipe.validation_fraction > 0)
    _check_process_group(training_args)
    if push and not save:
        raise ValueError("`push_to_hub=True` pushes the saved folder: it needs `save=True`.")
    if resume_from_checkpoint is None:
        resume_from_checkpoint = training_args.resume_from_checkpoint
    return training_args, push, True if resume_from_checkpoint == LAST_CHECKPOINT else resume_from_checkpoint


def _dataset_of(data, recipe: RecipeArguments, share=None):
    """`(dataset, label_texts, recipe)`: the `XMCDataset` given, or the one `recipe.data` names (`share`: the label
    texts it reads, `label_text_share`), refused when no training point has a label; its label texts where an option
    reads them (`label_texts_for`); the recipe, its `init_from_label_texts` off where the dataset has no label texts
    (the fallback: random rows, one warning)."""
    dataset = (
        data
        if data is not None and not isinstance(data, (str, os.PathLike))
        else load_dataset(recipe.data, recipe.format, recipe.text_fields, recipe.label_texts, share)
    )
    if dataset.train_label_frequencies is not None and not np.asarray(dataset.train_label_frequencies).any():
        raise ValueError(
            f"The training split of {recipe.data or DEMO_DATASET_NAME} has no positive label (every point's label list "
            "is empty): there is nothing to learn. Check the label column or file."
        )
    if recipe.init_from_label_texts and dataset.label_texts is None:
        logger.warning(
            f"{recipe.data or DEMO_DATASET_NAME} has no label texts (no lbl.json.gz or Y.txt): the head and tail start "
            "at random instead of from them (--init-from-label-texts)."
        )
        recipe = dataclasses.replace(recipe, init_from_label_texts=False)
    label_texts = label_texts_for(
        dataset,
        recipe.data,
        init_from_label_texts=recipe.init_from_label_texts,
        label_text_grouping_below=recipe.label_text_grouping_below,
    )
    return dataset, label_texts, recipe


def _encoder_of(recipe: RecipeArguments):
    """`(encoder, tokenizer)`, the tokenizer set to the recipe's length (the model's input length from now on,
    saved with it) once the encoder is known to read it."""
    encoder_model, tokenizer = load_encoder(recipe.encoder)
    check_max_length(encoder_model, recipe.max_length, recipe.encoder)
    tokenizer.model_max_length = recipe.max_length
    return encoder_model, tokenizer


def _shared_layout(train_split, dataset, encoder_model, tokenizer, pooling, recipe, training_args, layout, label_texts):
    """The label layout, computed (or checked) once by the main process: the other ranks take rank 0's (CUDA
    reductions need not agree between runs), read from a file rank 0 writes (16 GB at 10^9 labels: not pickled),
    without its training counts (rank 0's model card alone reads them)."""
    from .training.distributed import broadcast_through_file

    if process_rank_and_count()[0] == 0:
        layout = build_layout(
            train_split,
            dataset.label_count,
            encoder_model,
            tokenizer,
            layout=layout if layout is not None else recipe.layout_file,
            group_size=recipe.group_size,
            head_label_fraction=recipe.head_label_fraction,
            grouping=recipe.grouping,
            beta=recipe.beta,
            pooling=pooling,
            seed=training_args.seed,
            max_length=recipe.max_length,
            batch_size=training_args.per_device_eval_batch_size,
            label_texts=label_texts,
            label_text_grouping_below=recipe.label_text_grouping_below,
            frequency_bands=recipe.frequency_bands,
        )
    load_without_counts = lambda path: LabelLayout.load(path, label_frequencies=False)  # noqa: E731
    return broadcast_through_file(layout, training_args.output_dir, LabelLayout.save, load_without_counts)


def _model_of(
    encoder_model,
    tokenizer,
    layout: LabelLayout,
    dataset,
    pooling: str,
    recipe,
    training_args,
    label_texts,
):
    """The new model; its head and tail started from the label texts where asked for. A sharded run's ranks build
    only their own rows of the head and tail (the same rows as one process: `haste_hf.modeling.initialization`), and
    start them from their own labels' texts (`init_share_from_label_texts_`); one process builds them where and in
    the dtype they train in (`output_rows_on`), never whole in fp32 on the host."""
    import torch

    from .modeling.initialization import deferred_output_rows, output_rows_on
    from .training.sharded_output_layer import resolve_shard_output_layer, shard_output_layer_

    sharded = resolve_shard_output_layer(training_args.shard_output_layer, training_args.world_size)
    from_label_texts = recipe.init_from_label_texts and label_texts is not None
    dtype = training_args.output_layer_dtype and getattr(torch, training_args.output_layer_dtype)
    with deferred_output_rows() if sharded else output_rows_on(training_args.device, dtype):
        model = build_model(
            encoder_model,
            layout,
            label_count=dataset.label_count,
            label_names=dataset.label_texts,
            fan_in=recipe.fan_in,
            pooling=pooling,
            head_projection_dim=recipe.head_projection_dim,
            tail_projection_dim=recipe.tail_projection_dim,
            tail_bias=recipe.tail_bias,
        )
    if sharded and from_label_texts:  # sharded here: each rank starts its own rows, in the dtype they train in
        for module in (model.output_layer.head, model.output_layer.tail):
            if module is not None and training_args.output_layer_dtype is not None:
                module.to(getattr(torch, training_args.output_layer_dtype))
        shard_output_layer_(model)
    if from_label_texts:
        from .labels.text_init import init_from_label_texts_, init_share_from_label_texts_

        (init_share_from_label_texts_ if sharded else init_from_label_texts_)(
            model,
            label_texts,
            tokenizer=tokenizer,
            scale=recipe.label_text_init_scale,
            batch_size=training_args.per_device_eval_batch_size,
            device=training_args.device,
        )
    return model


def _card_fields(recipe: RecipeArguments, dataset_name: str, propensity, training_args) -> CardFields:
    return CardFields(
        encoder_name=encoder_model_id(recipe.encoder),
        dataset_name=dataset_name,
        propensity=propensity,
        hub_model_id=training_args.hub_model_id,
        dataset_id=recipe.dataset_name,
        label_text_init=recipe.init_from_label_texts,
    )


def _test_metrics(trainer, tokenizer, dataset, propensity, recipe, training_args, evaluate_test: bool) -> dict:
    """The trained model's metrics on the test split; none where not asked for or the dataset has no test split."""
    if not (evaluate_test and "test" in dataset.splits):
        return {}
    sizes = dict(max_length=recipe.max_length, batch_size=training_args.per_device_eval_batch_size)
    return evaluate_split(trainer.model, tokenizer, dataset, "test", propensity, **sizes)


def _evaluation_settings(recipe: RecipeArguments, training_args) -> dict:
    """How the test metrics are computed, saved for `haste-hf evaluate`: the text read as resolved (`evaluate`
    without --data reads the demo set, whose default differs)."""
    return (
        {name: getattr(recipe, name) for name in EVALUATION_SETTINGS}
        | {"text_fields": resolved_text_fields(recipe.data, recipe.text_fields)}
        | {"eval_batch_size": training_args.per_device_eval_batch_size}
    )


def train(
    data=None,
    encoder: str = DEMO_ENCODER,
    output_dir: str | None = None,
    *,
    training_args=None,
    layout: "LabelLayout | str | None" = None,
    callbacks=None,
    save: bool = True,
    evaluate_test: bool = True,
    recipe_args: RecipeArguments | None = None,
    resume_from_checkpoint: str | bool | None = None,
    **options,
) -> TrainingRun:
    """Trains a HASTE model on an XMC dataset and evaluates it on the dataset's test split.

    Args:
        data: a dataset folder, an `XMCDataset`, or None for the embedded demo set.
        encoder: model id or path of the encoder.
        output_dir: where the model, tokenizer, card and checkpoints go (default: `training_args.output_dir`).
        training_args: a `HasteTrainingArguments`, or a dict of its fields completed with the recipe's defaults
            (checkpoint and evaluate each epoch on the validation split, keep the best P@1). With
            `push_to_hub=True` the saved folder is pushed to `hub_model_id` once, test metrics and card included.
        layout: a `LabelLayout` (or its file) of the training split, checked against it; by default computed from
            the structure options (`group_size`, `head_label_fraction`, `grouping`, `beta`).
        callbacks: extra `TrainerCallback`s.
        save: write the model folder (model, tokenizer, card, `test_metrics.json`). The model is saved before
            the test evaluation, so a failure there loses nothing; the metrics are added after.
        evaluate_test: evaluate on the test split when the dataset has one.
        recipe_args: all `RecipeArguments` at once (what `haste-hf train` passes); or give them as `**options`.
            An `output_dir` that holds a model or checkpoints is refused unless `overwrite_output_dir=True`
            (replace them) or resuming, and so is one another run is training into (`run_lock`).
        resume_from_checkpoint: continue the training of `output_dir` from its last complete checkpoint (True,
            or `"last"`) or from the checkpoint folder given; default: `training_args.resume_from_checkpoint`.
    """
    from .recipe_arguments import label_text_share
    from .training.callbacks import TrainingSplitFingerprint

    recipe = _recipe_arguments(data, encoder, recipe_args, options)
    started = time.time()
    training_args, push, resume = _run_arguments(training_args, output_dir, recipe, save, resume_from_checkpoint)
    output_dir, seed = training_args.output_dir, training_args.seed
    run_folder = RunFolder(output_dir, overwrite=recipe.overwrite_output_dir, resume=bool(resume))
    run_folder.check()
    if resume:
        run_folder.check_resume_keeps_the_model(last_complete_checkpoint(output_dir) if resume is True else resume)
    is_main = process_rank_and_count()[0] == 0
    # Held from here to the end: a second run into this folder is refused now, not after its training.
    with run_folder.held(is_main):
        dataset, label_texts, recipe = _dataset_of(data, recipe, label_text_share(recipe, training_args))
        train_split, validation_split = split_validation(dataset.splits["train"], recipe.validation_fraction, seed)
        encoder_model, tokenizer = _encoder_of(recipe)
        pooling = encoder_pooling(recipe.encoder, encoder_model, recipe.pooling)
        layout = _shared_layout(
            train_split, dataset, encoder_model, tokenizer, pooling, recipe, training_args, layout, label_texts
        )
        set_seed(seed)  # the new head and tail weights: a function of the seed, the same on every rank
        initial_texts = None if resume else label_texts  # resumed, the checkpoint's weights replace the rows
        model = _model_of(encoder_model, tokenizer, layout, dataset, pooling, recipe, training_args, initial_texts)
        dataset_name = dataset_name_of(recipe.data, recipe.dataset_name)
        propensity = propensity_of(dataset, dataset_name, recipe.propensity_a, recipe.propensity_b)
        if layout.split_fingerprint is not None:  # kept in each checkpoint: resuming on other data is refused
            callbacks = [*(callbacks or []), TrainingSplitFingerprint(layout.split_fingerprint)]
        trainer = build_trainer(
            model, tokenizer, training_args, train_split, validation_split, propensity, recipe.max_length, callbacks
        )
        if trainer.is_world_process_zero():
            run_folder.clear_checkpoints()
        trainer.train(resume_from_checkpoint=resume)
        seconds = time.time() - started
        card = _card_fields(recipe, dataset_name, propensity, training_args)
        if save:  # before the test evaluation: whatever happens there, the trained model is kept
            evaluation_settings = _evaluation_settings(recipe, training_args)
            save_trained(trainer, tokenizer, layout, output_dir, card, evaluation_settings=evaluation_settings)
        test_metrics = _test_metrics(trainer, tokenizer, dataset, propensity, recipe, training_args, evaluate_test)
        if save and is_main:
            card = dataclasses.replace(card, test_metrics=test_metrics)
            run_folder.add_files(lambda folder: write_results(folder, trainer, layout, output_dir, card))
        if push and is_main:
            run_folder.push(training_args)
        saved_to = output_dir if save else None
        return TrainingRun(trainer.model, tokenizer, layout, trainer, test_metrics, propensity, seconds, saved_to)


__all__ = [
    "DEMO_ENCODER",
    "EVALUATION_SETTINGS_FILE",
    "RecipeArguments",
    "CardFields",
    "TrainingRun",
    "build_layout",
    "build_model",
    "build_trainer",
    "check_max_length",
    "check_output_dir",
    "encoder_model_id",
    "evaluate_split",
    "label_texts_for",
    "load_dataset",
    "encoder_pooling",
    "load_encoder",
    "model_selection_arguments",
    "predict_top_k",
    "propensity_of",
    "resolve_encoder",
    "save_trained",
    "saved_evaluation_settings",
    "split_validation",
    "train",
]
