# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste-hf`: train, evaluate, predict, group and publish HASTE models from the command line.

    haste-hf demo                                   # the embedded dataset, the offline MiniLM encoder
    haste-hf train --data DIR --encoder NAME --output-dir OUT
    haste-hf evaluate --model OUT --data DIR
    haste-hf predict --model OUT --input texts.txt --output predictions.jsonl
    haste-hf group --data DIR --encoder NAME --output layout.safetensors   # then train --layout-file
    haste-hf push --model OUT --repo-id user/name
    haste-hf export --model OUT --format onnx --output OUT-onnx              # serve with onnxruntime

Nothing heavy loads before the arguments are checked: `--help`, `--version`, each command's `--help` and its usage
errors answer without torch or transformers (this module imports neither, nor does `import haste_hf`). The flags of
`train`, `demo` and `group`, fields of dataclasses that need transformers, are checked against their snapshot
(`train_flags.py`); the dataclasses load once the arguments check out.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from .model_sources import HUB_ID_PATTERN, check_model_source
from .train_flags import LAST_CHECKPOINT, field_names, flag_description, flags_parser


SUMMARY_METRICS = ("P", "PSP", "nDCG")
DEBUG_VARIABLE = "HASTE_HF_DEBUG"


class UsageError(Exception):
    """A bad argument, path or combination of them: reported in one line with exit status 2."""


def is_model_file_error(error: BaseException) -> bool:
    """Whether `error` is what loading a damaged or mismatched weights file raises: safetensors' own error, a pickle
    that does not unpickle (`torch.load` of an optimizer or argument file), a state dict of other shapes."""
    import pickle

    from safetensors import SafetensorError

    if isinstance(error, (SafetensorError, pickle.UnpicklingError)):
        return True
    return type(error) is RuntimeError and any(
        sign in str(error) for sign in ("state_dict", "ignore_mismatched_sizes", "size mismatch")
    )


# ------------------------------------------------------------------------------------------------ argument types
# Checked while parsing, before anything heavy loads; argparse reports a failure as
# "haste-hf CMD: error: argument --flag: <message>".


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not value > 0:  # NaN too
            raise argparse.ArgumentTypeError(f"must be {'>= 1' if kind is int else '> 0'}, got {text}")
        return value

    return parse


positive_int = _positive(int)
positive_float = _positive(float)


def existing_folder(text):
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"no folder {text!r}" + (" (it is a file)" if os.path.isfile(text) else ""))
    return text


def existing_file(text):
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no file {text!r}" + (" (it is a folder)" if os.path.isdir(text) else ""))
    return text


def output_file(text):
    """A file to write: its folder must exist (checked now, not after hours of work)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file path")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder of {text!r} ({folder}) does not exist; create it first")
    return text


def hub_id(text):
    if not HUB_ID_PATTERN.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repository id such as user/model")
    return text


def model_reference(text, namespaced=False):
    """A local model folder, or a Hub id; a path that names no folder is an error, not a Hub id."""
    try:
        check_model_source(text, what=None, namespaced=namespaced)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def trained_model_reference(text):
    return model_reference(text, namespaced=True)


# ------------------------------------------------------------------------------------------------ helpers


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from . import __version__

    def installed(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return f"haste-hf {__version__} (transformers {installed('transformers')}, torch {installed('torch')})"


def default_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_data(args):
    from .recipe import load_dataset

    return load_dataset(args.data, args.format, args.text_fields, getattr(args, "label_texts", False))


def propensity_for(args, data):
    from .recipe import dataset_name_of, propensity_of

    return propensity_of(data, dataset_name_of(args.data, args.dataset_name), args.propensity_a, args.propensity_b)


def format_summary(title: str, metrics: dict, extra: dict | None = None) -> str:
    """A fixed-width table: one row per metric family, one column per k, then extra lines."""
    from .metrics import DEFAULT_KS

    width = 10
    lines = [title, "-" * (8 + width * len(DEFAULT_KS))]
    lines.append(f"{'':8}" + "".join(f"{'@' + str(k):>{width}}" for k in DEFAULT_KS))
    for name in SUMMARY_METRICS:
        values = [metrics.get(f"{name}@{k}") for k in DEFAULT_KS]
        if any(value is not None for value in values):
            lines.append(f"{name:8}" + "".join(f"{'' if v is None else f'{100 * v:.2f}':>{width}}" for v in values))
    lines.append("-" * (8 + width * len(DEFAULT_KS)))
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def evaluate_split(model, tokenizer, data, split, args, propensity):
    from .recipe import evaluate_split

    return evaluate_split(
        model, tokenizer, data, split, propensity, batch_size=args.eval_batch_size, max_length=args.max_length
    )


# ------------------------------------------------------------------------------------------------ commands


def command_train(args) -> int:
    from .recipe import check_output_dir, train

    training = args.training
    check_report_to(training.report_to)
    try:
        check_output_dir(
            training.output_dir,
            overwrite=args.recipe.overwrite_output_dir,
            resume=bool(training.resume_from_checkpoint),
        )
    except ValueError as error:
        raise UsageError(f"argument --output-dir: {error}") from None
    run = train(args.recipe.data, args.recipe.encoder, training_args=training, recipe_args=args.recipe)
    layout, skipped = run.layout, run.trainer.non_finite_guard.skipped_steps
    summary = format_summary(
        "Test metrics (%)",
        run.test_metrics,
        {
            "labels": f"{layout.label_count:,} (head {layout.head_label_count:,}, tail {layout.tail_label_count:,} in groups of {layout.group_size}, fan-in {args.recipe.fan_in})",
            "grouping": layout.strategy,
            "propensity": f"A={run.propensity.a}, B={run.propensity.b}",
            "steps": f"{run.trainer.state.global_step}"
            + (f" ({skipped} skipped: NaN or infinite gradients)" if skipped else ""),
            "time": f"{run.training_seconds / 60:.1f} min",
            "saved to": run.output_dir,
        },
    )
    print(summary)
    return 0


def load_trained(args):
    """The model and tokenizer of `args.model`; the data flags left unset take the values training used."""
    from transformers import AutoTokenizer

    from .configuration_haste import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH
    from .modeling_haste import HasteForExtremeClassification
    from .recipe import check_max_length, encoder_token_limit, saved_evaluation_settings

    from_training = saved_evaluation_settings(args.model) if Path(args.model).is_dir() else {}
    for name, value in from_training.items():
        if getattr(args, name, None) is None or (name == "format" and args.format == "auto"):
            setattr(args, name, value)
    args.eval_batch_size = args.eval_batch_size or DEFAULT_EVAL_BATCH_SIZE
    try:
        model = HasteForExtremeClassification.from_pretrained(args.model)
    except Exception as error:
        if not is_model_file_error(error):
            raise
        raise ValueError(
            f"{args.model}: its weights do not load ({one_line(error)}); save or download the model again"
        ) from error
    if args.max_length is None:  # a folder `train` did not write: the encoder's limit, at most the default
        args.max_length = min(DEFAULT_MAX_LENGTH, encoder_token_limit(model.encoder) or DEFAULT_MAX_LENGTH)
    try:
        check_max_length(model.encoder, args.max_length, f"of {args.model}")
    except ValueError as error:
        raise UsageError(error) from None
    return model.to(default_device()), AutoTokenizer.from_pretrained(args.model)


def check_split(args, data):
    if args.split not in data.splits:
        raise UsageError(
            f"argument --split: {args.split!r} is not a split of the dataset (splits: {', '.join(sorted(data.splits))})"
        )


def check_label_names(args, model, data) -> None:
    """Refuses data whose label names differ from the model's (the same count, another label space or order),
    unless `--ignore-label-names`: the metrics would score each label id against another label."""
    names, data_names = model.label_names, data.label_texts
    if args.ignore_label_names or names is None or data_names is None:
        return
    differing = [label for label, (name, data_name) in enumerate(zip(names, data_names)) if name != data_name]
    if differing:
        first = differing[0]
        raise UsageError(
            f"the labels of the model at {args.model} are not the dataset's: {len(differing):,} of {len(names):,} names "
            f"differ (label {first} is {names[first]!r} in the model, {data_names[first]!r} in the dataset). Evaluate "
            "the model on the dataset it was trained for, or pass --ignore-label-names to score it by label id anyway."
        )


def command_evaluate(args) -> int:
    from .saving import atomic_path

    model, tokenizer = load_trained(args)
    data = load_data(args)
    check_split(args, data)
    if data.label_count != model.config.label_count:
        raise UsageError(
            f"the model at {args.model} has {model.config.label_count:,} labels and the dataset {data.label_count:,}: "
            "evaluate a model on the dataset it was trained for."
        )
    check_label_names(args, model, data)
    propensity = propensity_for(args, data)
    metrics = evaluate_split(model, tokenizer, data, args.split, args, propensity)
    print(format_summary(f"{args.split} metrics (%)", metrics, {"propensity": f"A={propensity.a}, B={propensity.b}"}))
    if args.output:
        with atomic_path(args.output) as path:
            Path(path).write_text(json.dumps(metrics, indent=2))
    return 0


def read_texts(path: str) -> list[str]:
    """One text per line (line ends removed, blank lines kept so outputs stay aligned with the input)."""
    data = Path(path).read_bytes()
    try:
        texts = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise UsageError(
            f"argument --input: {path} line {line} is not UTF-8 text ({error.reason}: byte {data[error.start]:#04x} at "
            f"column {column}); save the file as UTF-8"
        ) from None
    if not texts:
        raise UsageError(f"argument --input: {path} holds no texts (one text per line)")
    return texts


def command_predict(args) -> int:
    import numpy as np

    from .recipe import predict_top_k
    from .saving import atomic_path

    texts = read_texts(args.input) if args.input else None
    model, tokenizer = load_trained(args)
    if args.k > model.config.label_count:
        raise UsageError(f"argument -k: {args.k} exceeds the {model.config.label_count} labels of the model")
    if texts is None:
        data = load_data(args)
        check_split(args, data)
        texts = data.splits[args.split]["text"]
    ids, logits = predict_top_k(model, tokenizer, texts, args.k, args.eval_batch_size, args.max_length)
    # As the text-classification pipeline scores them: each label's own sigmoid probability.
    scores = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    names = model.label_names
    with atomic_path(args.output) as path, open(path, "w", encoding="utf-8") as f:
        for row_ids, row_scores, row_logits in zip(ids.tolist(), scores.tolist(), logits.tolist()):
            record = {"label_ids": row_ids, "scores": [round(s, 6) for s in row_scores]}
            if args.logits:
                record["logits"] = [round(s, 6) for s in row_logits]
            if names is not None:
                record["labels"] = [names[i] for i in row_ids]
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"Wrote the top {args.k} labels of {len(texts):,} texts to {args.output}")
    return 0


# `RecipeArguments` that shape the model or its evaluation, not the label layout `haste-hf group` computes.
_NOT_GROUP_OPTIONS = (
    "fan_in",
    "head_projection_dim",
    "tail_projection_dim",
    "layout_file",
    "dataset_name",
    "propensity_a",
    "propensity_b",
)


def command_group(args) -> int:
    from transformers.utils import logging

    from .recipe import RecipeArguments, build_layout, check_max_length, load_dataset, load_encoder, split_validation

    logger = logging.get_logger(f"transformers.{__name__}")
    recipe = args.recipe
    ignored = [
        name
        for name in _NOT_GROUP_OPTIONS
        if getattr(recipe, name) != RecipeArguments.__dataclass_fields__[name].default
    ]
    if ignored:
        logger.warning(
            f"Ignored by `haste-hf group` (they are `train` options): {', '.join('--' + n.replace('_', '-') for n in ignored)}."
        )
    data = load_dataset(recipe.data, recipe.format, recipe.text_fields, recipe.label_texts)
    train_split, _ = split_validation(data.splits["train"], recipe.validation_fraction, args.seed)
    encoder, tokenizer = load_encoder(recipe.encoder)
    check_max_length(encoder, recipe.max_length, recipe.encoder)
    layout = build_layout(
        train_split,
        data.label_count,
        encoder,
        tokenizer,
        group_size=recipe.group_size,
        head_label_fraction=recipe.head_label_fraction,
        grouping=recipe.grouping,
        pooling=recipe.pooling,
        beta=recipe.beta,
        seed=args.seed,
        max_length=recipe.max_length,
        batch_size=args.per_device_eval_batch_size,
    )
    layout.save(args.output)
    print(f"{layout.describe()} -> {args.output}")
    return 0


def command_push(args) -> int:
    from huggingface_hub import constants
    from huggingface_hub.errors import HfHubHTTPError

    from .hub import push_to_hub

    try:
        url = push_to_hub(
            args.model, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message
        )
    except HfHubHTTPError as error:
        if getattr(error.response, "status_code", None) != 401:
            raise
        raise ValueError(
            f"the Hub at {constants.ENDPOINT} refused the credentials (401 Unauthorized): log in with `hf auth login` "
            "(or set HF_TOKEN to a token with write access), then run the command again."
        ) from None
    print(f"Pushed {args.model} to {url}")
    return 0


def command_add_labels(args) -> int:
    import shutil

    from .label_additions import check_new_names, examples_from_split, read_new_labels, sample_texts
    from .recipe import check_output_dir, load_dataset
    from .saving import save_trained_folder

    try:
        check_output_dir(args.output_dir, overwrite=args.overwrite_output_dir)
    except ValueError as error:
        raise UsageError(f"argument --output-dir: {error}") from None
    if args.data is not None and args.negatives is None:
        raise UsageError("argument --data: fitting the new labels on examples needs --negatives (the training data)")
    model, tokenizer = load_trained(args)
    try:
        texts, names = read_new_labels(args.labels)
        names = check_new_names(model, texts, names)
    except ValueError as error:
        raise UsageError(f"argument --labels: {one_line(error)}") from None
    examples = None
    if args.data is not None:
        try:
            examples = examples_from_split(
                load_dataset(args.data, args.format, args.text_fields).splits["train"], len(texts)
            )
        except ValueError as error:
            raise UsageError(f"argument --data: {one_line(error)}") from None
    negatives = None
    if args.negatives is not None:
        negatives = sample_texts(
            load_dataset(args.negatives, args.format, args.text_fields).splits["train"], args.negative_count, args.seed
        )
    ids = model.add_labels(
        texts,
        examples=examples,
        negatives=negatives,
        names=names,
        head=args.head,
        tokenizer=tokenizer,
        seed=args.seed,
        batch_size=args.eval_batch_size,
        max_length=args.max_length,
    )
    settings = Path(args.model) / "evaluation_settings.json"

    def write_extra(folder: Path):  # evaluate and predict keep reading texts as training did
        if settings.is_file():
            shutil.copyfile(settings, folder / settings.name)

    save_trained_folder(args.output_dir, model, tokenizer, write_extra)
    where = "the head" if args.head else "the tail"
    print(f"{len(ids)} labels added to {where} (ids {ids[0]} to {ids[-1]}) -> {args.output_dir}")
    return 0


def _add_add_labels_parser(commands):
    add_help = "Add labels to a trained model from their texts (and a few examples), without retraining it."
    add = commands.add_parser(
        "add-labels",
        help=add_help,
        description=add_help + " The scores of the existing labels stay the same.",
        formatter_class=HelpFormatter,
    )
    add.add_argument("--model", required=True, type=existing_folder, help="Folder of a trained model.")
    add.add_argument(
        "--labels",
        required=True,
        type=existing_file,
        help='JSON file of the new labels: [{"name": ..., "text": ...}, ...] or {name: text, ...}.',
    )
    add.add_argument(
        "--negatives",
        type=existing_folder,
        default=None,
        help="The model's training data: a sample of its texts are the negatives of a short fit of the new labels.",
    )
    add.add_argument("--negative-count", type=positive_int, default=2048, help="Training texts sampled as negatives.")
    add.add_argument("--head", action="store_true", help="Put the new labels in the dense head, not in tail groups.")
    add.add_argument("--output-dir", required=True, help="Folder to save the model with the new labels to.")
    add.add_argument("--overwrite-output-dir", action="store_true", help="Replace a model already in --output-dir.")
    add.add_argument("--seed", type=int, default=0, help="Seed of the negatives' sample and the new groups.")
    _add_data_arguments(
        add,
        of_trained_model=True,
        data_help="Few-shot examples of the new labels: a dataset folder (read as --negatives) whose label ids index "
        "the entries of --labels.",
    )
    add.set_defaults(handler=command_add_labels)


# ------------------------------------------------------------------------------------------------ export


def command_export(args) -> int:
    from .export import check_export_dependencies, check_export_dir, export_onnx

    try:
        check_export_dependencies()
    except ImportError as error:
        _report(args.prog, f"error: {one_line(error)}")
        return 1
    output = args.output or f"{Path(args.model).name}-onnx"
    try:
        check_export_dir(output, args.overwrite)
    except ValueError as error:
        raise UsageError(f"argument --output: {error}") from None
    layout = export_onnx(
        args.model,
        output,
        args.k,
        layout="split" if args.split_output_layer else "auto",
        quantize=args.quantize,
        overwrite=args.overwrite,
    )
    print(f"Exported {args.model} to {output} ({layout} layout; see {Path(output) / 'README.md'})")
    return 0


def _add_export_parser(commands):
    export_help = (
        "Export a trained model for serving with onnxruntime (ONNX: encoder, pooling, output layer and top-k)."
    )
    export = commands.add_parser(
        "export",
        help=export_help,
        description=export_help + " An output layer too large for "
        "one ONNX file (2 GB) is written beside the encoder graph in safetensors.",
    )
    export.add_argument(
        "--model", required=True, type=trained_model_reference, help="Folder (or Hub id) of a trained model."
    )
    export.add_argument("--format", default="onnx", choices=("onnx",), help="Export format (default: onnx).")
    export.add_argument(
        "--output", default=None, help="Export folder, new or empty (default: the model's name + '-onnx')."
    )
    export.add_argument("-k", type=positive_int, default=5, help="Labels per text the graph returns (default: 5).")
    export.add_argument(
        "--quantize", action="store_true", help="Quantize the encoder's matmuls to int8 (dynamic quantization)."
    )
    export.add_argument(
        "--split-output-layer",
        action="store_true",
        help="Write the output layer in safetensors beside an encoder-only graph, whatever its size.",
    )
    export.add_argument("--overwrite", action="store_true", help="Replace a previous export in --output.")
    export.set_defaults(handler=command_export)


# ------------------------------------------------------------------------------------------------ parser


class ArgumentParser(argparse.ArgumentParser):
    """Reports a usage error in one line (`haste-hf CMD: error: ...`) with exit status 2, no usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends a flag's default to its help, unless it has none or its help already says what it is."""

    def _get_help_string(self, action):
        if action.default is None or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


def _add_data_arguments(parser, required=False, of_trained_model=False, data_help=None):
    """`of_trained_model`: the flags of `evaluate` and `predict`, which default to the model's training settings;
    `data_help`: what `--data` holds for this command, where it is not the dataset to score."""
    group = parser.add_argument_group("data")
    saved = " (default: as in training)" if of_trained_model else ""
    group.add_argument(
        "--data",
        required=required,
        type=existing_folder,
        help=data_help
        or "Dataset folder in an Extreme Classification Repository raw-text format (JSON lines, or "
        "raw text + sparse labels; bag-of-words data has no texts to encode). Default: the embedded demo set.",
    )
    group.add_argument(
        "--format",
        default="auto",
        choices=("auto", "json", "text_sparse"),
        help="Dataset format; 'auto' detects it from the file names.",
    )
    group.add_argument(
        "--text-fields",
        choices=("title", "title_content"),
        default=None,
        help="Text of a JSON-lines instance: its title, or title + content. Default: title (title_content for the demo set).",
    )
    group.add_argument(
        "--dataset-name",
        default=None,
        help="Name for the model card and propensity presets (default: the folder name).",
    )
    group.add_argument(
        "--propensity-a",
        type=positive_float,
        default=None,
        help="Propensity A for PSP (default: preset by dataset name).",
    )
    group.add_argument(
        "--propensity-b",
        type=positive_float,
        default=None,
        help="Propensity B for PSP (default: preset by dataset name).",
    )
    group.add_argument(
        "--max-length",
        type=positive_int,
        default=None if of_trained_model else 128,
        help=f"Tokens per text; longer texts are truncated{saved}.",
    )
    group.add_argument(
        "--eval-batch-size",
        type=positive_int,
        default=None if of_trained_model else 64,
        help=f"Batch size of embedding, evaluation and prediction{saved}.",
    )


# The `train` flags are every `RecipeArguments` and `HasteTrainingArguments` field (`--learning-rate`, ...);
# these defaults differ from the dataclasses' for a command-line run: checkpoint and evaluate each epoch on the
# validation split and keep the best P@1. A function, as the shared defaults live in configuration_haste, which
# imports transformers.
def train_defaults() -> dict:
    return dict(
        output_dir="haste-model",
        logging_steps=20,
        seed=0,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="P@1",
        greater_is_better=True,
        save_total_limit=1,
        report_to="none",
    )


# The demo's folder is its own: running it again replaces it.
# Its recipe is its own too (3,000 texts on 2 CPU cores in minutes), so the README's table stays what it prints.
DEMO_DEFAULTS = dict(
    encoder="minilm",
    num_train_epochs=3,
    per_device_train_batch_size=32,
    max_length=32,
    learning_rate=1e-4,
    output_learning_rate=0.05,
    fan_in=64,
    validation_fraction=0.1,
    rewiring_interval=50,
    output_dir="haste-demo",
    overwrite_output_dir=True,
)
# Short forms of `train` flags (those of earlier versions), read as the long ones.
SHORT_FLAGS = {
    "--lr": "--learning-rate",
    "--epochs": "--num-train-epochs",
    "--batch-size": "--per-device-train-batch-size",
    "--eval-batch-size": "--per-device-eval-batch-size",
    "--warmup": "--warmup-steps",
    "--output-lr": "--output-learning-rate",
    "--output-warmup": "--output-warmup-steps",
    "--num-workers": "--dataloader-num-workers",
    "--private": "--hub-private-repo",
    "--rewiring-end": "--rewiring-end-fraction",
}
TRAIN_EPILOG = (
    " Every flag may also come from a JSON or YAML file (--config FILE; its keys are the flag names with"
    " underscores, e.g. learning_rate: 1.0e-4), flags on the command line win. Short forms: "
    + ", ".join(f"{short} ({long})" for short, long in SHORT_FLAGS.items())
    + ". Publishing: --push-to-hub --hub-model-id user/name. --bf16: bf16 autocast and a bf16 head and tail"
    " (--output-layer-dtype float32 keeps them in float32). --eval-steps N: evaluate and checkpoint every N steps."
)


def _recipe_parser(live=False):
    """The `RecipeArguments` flags: from the snapshot (`train_flags.json`, light), or `live` from the dataclass."""
    if not live:
        return flags_parser("RecipeArguments")
    from transformers import HfArgumentParser

    from .recipe import RecipeArguments

    return HfArgumentParser(RecipeArguments, add_help=False)


def _train_parser_kwargs(live=False) -> dict:
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config", default=None, help="A JSON or YAML file of flag values (keys: flag names with underscores)."
    )
    if live:
        from transformers import HfArgumentParser

        from .recipe import RecipeArguments
        from .training_args import HasteTrainingArguments

        fields = HfArgumentParser((RecipeArguments, HasteTrainingArguments), add_help=False)
    else:
        fields = flags_parser("RecipeArguments", "HasteTrainingArguments")
    return dict(parents=[config, fields], formatter_class=HelpFormatter)


def _yaml_without_duplicate_keys(text: str, path: str):
    """`yaml.safe_load(text)`, refusing a mapping that repeats a key (YAML keeps the last one in silence)."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise UsageError(
                        f"argument --config: {path}: key {key!r} is given twice (line {key_node.start_mark.line + 1}); keep one."
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Loader)  # a SafeLoader: no object is built from a tag


def _json_object_without_duplicate_keys(path: str):
    def build(pairs):
        keys = [key for key, _ in pairs]
        repeated = next((key for key in keys if keys.count(key) > 1), None)
        if repeated is not None:
            raise UsageError(f"argument --config: {path}: key {repeated!r} is given twice; keep one.")
        return dict(pairs)

    return build


def read_config_file(path: str, known: set[str]) -> dict:
    """Flag values from a JSON or YAML mapping; unknown keys are refused with the nearest known name, and a key
    given twice (also as `learning-rate` and `learning_rate`) is refused."""
    import difflib

    if not os.path.isfile(path):
        raise UsageError(f"argument --config: no file {path!r}")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"argument --config: {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            values = _yaml_without_duplicate_keys(text, path)
        except yaml.YAMLError as error:
            raise UsageError(f"argument --config: {path} is not valid YAML: {error}") from None
    else:
        try:
            values = json.loads(text, object_pairs_hook=_json_object_without_duplicate_keys(path))
        except ValueError as error:
            raise UsageError(f"argument --config: {path} is not valid JSON: {error}") from None
    if not isinstance(values, dict):
        raise UsageError(
            f"argument --config: {path}: expected a mapping of flag names to values, got {type(values).__name__}."
        )
    normalized = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise UsageError(f"argument --config: {path}: key {key!r} is not a flag name.")
        name = key.replace("-", "_")
        if name in normalized:
            raise UsageError(f"argument --config: {path}: {name!r} is given twice (as {key!r} too); keep one.")
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            raise UsageError(
                f"argument --config: {path}: unknown key {name!r}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
                + "."
            )
        normalized[name] = value
    return normalized


def check_config_values(path: str, values: dict, parser: argparse.ArgumentParser, may_be_null: set[str]) -> None:
    """Refuses a config value of the wrong type for its flag, naming the key: argparse checks a default only
    when it is a string, and then names the flag but not the file, so `fan_in: 6.7` or `batch_size: null`
    would reach the run unchecked. `may_be_null`: the fields whose type allows None."""
    from transformers.hf_argparser import string_to_bool

    from .train_flags import string_to_bool as flags_string_to_bool

    actions = {action.dest: action for action in parser._actions}
    for key, value in values.items():
        action = actions.get(key)
        if action is None:
            continue
        if value is None:
            if key not in may_be_null:
                raise UsageError(f"argument --config: {path}: {key!r} is null; give a value or leave the key out.")
            continue
        kind = string_to_bool if action.type is flags_string_to_bool else action.type  # the snapshot's own copy
        items = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
        for item in items:
            if action.choices is not None:
                choice = kind(item) if callable(kind) and isinstance(item, str) else item
                ok, expected = choice in action.choices, f"one of {', '.join(map(str, action.choices))}"
            elif kind not in (int, float, string_to_bool):
                continue
            elif isinstance(item, str):  # as the flag's text: "1e-4" (YAML reads it as a string), "true"
                try:
                    ok = kind(item) is not None
                except (TypeError, ValueError):
                    ok = False
                expected = {int: "an integer", float: "a number", string_to_bool: "true or false"}[kind]
            elif kind is int:
                ok, expected = isinstance(item, int) and not isinstance(item, bool), "an integer"
            elif kind is float:
                ok, expected = isinstance(item, (int, float)) and not isinstance(item, bool), "a number"
            else:
                ok, expected = isinstance(item, bool), "true or false"
            if not ok:
                raise UsageError(f"argument --config: {path}: {key!r} must be {expected}, got {item!r}.")


# Commands whose flags come from dataclasses that import transformers (and torch): their parsers are built only when
# the command runs or its --help is asked for, from the flags' snapshot (`train_flags.json`) unless `live`.
DATACLASS_COMMANDS = ("train", "demo", "group")
TRAIN_HELP = "Train a HASTE model on a dataset (default: the embedded demo set) and evaluate it on its test split."
DEMO_HELP = "Train on the embedded demo set with the offline MiniLM encoder (the flags of `train`, demo defaults)."
GROUP_HELP = "Precompute the label layout: the head/tail split and the tail's label groups of the training split."
PUSH_HELP = "Publish a trained model folder to the Hub (weights, code, labels, card)."
HUB_ENDPOINT = "https://huggingface.co"


def push_description() -> str:
    endpoint = os.environ.get("HF_ENDPOINT", HUB_ENDPOINT).rstrip("/")
    return (
        f"{PUSH_HELP} It goes to {endpoint} (set HF_ENDPOINT for another Hub; default {HUB_ENDPOINT}), with the "
        "token saved by `hf auth login` (or HF_TOKEN); log in first."
    )


def build_parser(config: dict | None = None, command: str | None = None, live: bool = False) -> argparse.ArgumentParser:
    """The `haste-hf` parser; `config` (flag values read from a `--config` file) sets `train` / `demo` defaults.
    The flags of `train`, `demo` and `group` are added only where `command` is that one; `live` reads them from the
    dataclasses (importing transformers) rather than from their snapshot."""
    parser = ArgumentParser(
        prog="haste-hf",
        description="HASTE extreme multi-label classifiers for Hugging Face Transformers.",
        epilog=f"Errors are reported in one line; set {DEBUG_VARIABLE}=1 for the traceback.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=version_text(),
        help="Print the versions of haste-hf, transformers and torch.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    for name, help, demo_defaults in (("train", TRAIN_HELP, {}), ("demo", DEMO_HELP, DEMO_DEFAULTS)):
        if name != command:
            commands.add_parser(name, help=help)
            continue
        train = commands.add_parser(name, help=help, description=help + TRAIN_EPILOG, **_train_parser_kwargs(live))
        train.set_defaults(handler=command_train, **{**train_defaults(), **demo_defaults, **(config or {})})

    evaluate = commands.add_parser(
        "evaluate", help="Evaluate a trained model on a dataset split.", formatter_class=HelpFormatter
    )
    evaluate.add_argument(
        "--model", required=True, type=trained_model_reference, help="Folder (or Hub id) of a trained model."
    )
    evaluate.add_argument("--split", default="test", help="Split to evaluate.")
    evaluate.add_argument("--output", type=output_file, default=None, help="Also write the metrics to this JSON file.")
    evaluate.add_argument(
        "--ignore-label-names",
        action="store_true",
        help="Evaluate even when the dataset's label names differ from the model's (labels are matched by id).",
    )
    _add_data_arguments(evaluate, of_trained_model=True)
    evaluate.set_defaults(handler=command_evaluate)

    predict = commands.add_parser(
        "predict", help="Write the top-k labels of texts to a JSON-lines file.", formatter_class=HelpFormatter
    )
    predict.add_argument(
        "--model", required=True, type=trained_model_reference, help="Folder (or Hub id) of a trained model."
    )
    predict.add_argument(
        "--input", type=existing_file, default=None, help="Text file, one text per line (default: --data's --split)."
    )
    predict.add_argument("--split", default="test", help="Dataset split to predict when no --input is given.")
    predict.add_argument(
        "--output",
        required=True,
        type=output_file,
        help="JSON-lines file: label ids, scores (sigmoid probabilities) and names per text.",
    )
    predict.add_argument("-k", type=positive_int, default=5, help="Labels per text.")
    predict.add_argument("--logits", action="store_true", help="Also write the raw logits (under `logits`).")
    _add_data_arguments(predict, of_trained_model=True)
    predict.set_defaults(handler=command_predict)

    if command != "group":
        commands.add_parser("group", help=GROUP_HELP)
    else:
        _add_group_parser(commands, live)

    push = commands.add_parser("push", help=PUSH_HELP, description=push_description(), formatter_class=HelpFormatter)
    push.add_argument("--model", required=True, type=existing_folder, help="Folder of a trained model.")
    push.add_argument("--repo-id", required=True, type=hub_id, help="Hub repository, e.g. user/haste-model.")
    push.add_argument("--private", action="store_true", help="Create the repository as private.")
    push.add_argument("--revision", default=None, help="Branch to push to (created if missing).")
    push.add_argument("--commit-message", default="Upload HASTE model", help="Commit message.")
    push.set_defaults(handler=command_push)
    _add_export_parser(commands)
    _add_add_labels_parser(commands)
    return parser


def _add_group_parser(commands, live):
    group = commands.add_parser(
        "group", help=GROUP_HELP, description=GROUP_HELP, parents=[_recipe_parser(live)], formatter_class=HelpFormatter
    )
    group.add_argument(
        "--output",
        required=True,
        type=output_file,
        help="Where to save the label layout (safetensors), for `train --layout-file`.",
    )
    defaults = train_defaults()
    group.add_argument(
        "--seed",
        type=int,
        default=defaults["seed"],
        help="Seed of the validation hold-out and the grouping (as `train --seed`).",
    )
    eval_batch_size = next(
        record["default"]
        for record in flag_description()["HasteTrainingArguments"]
        if record["dest"] == "per_device_eval_batch_size"
    )
    group.add_argument(
        "--per-device-eval-batch-size",
        "--eval-batch-size",
        dest="per_device_eval_batch_size",
        type=positive_int,
        default=eval_batch_size,
        help="Batch size of the label embeddings.",
    )
    group.set_defaults(handler=command_group)


def _long_flag(token: str) -> str:
    """`token` with a short flag name (`--lr`, `--lr=0.1`) replaced by its long one."""
    name, equals, value = token.partition("=")
    return SHORT_FLAGS.get(name, name) + equals + value


def _config_path(argv: list[str]) -> str | None:
    for position, token in enumerate(argv):
        if token == "--config" and position + 1 < len(argv):
            return argv[position + 1]
        if token.startswith("--config="):
            return token.split("=", 1)[1]
    return None


def _flags_given_alone(argv: list[str]) -> list[str]:
    """Flags given alone that take a value: `--resume-from-checkpoint` reads as `--resume-from-checkpoint last` (the
    last complete checkpoint), `--bf16` as `--bf16 true` (its default, None, picks by the hardware)."""
    alone = {"--resume-from-checkpoint": LAST_CHECKPOINT, "--bf16": "true"}
    return [
        f"{token}={alone[token]}"
        if token in alone and (position + 1 == len(argv) or argv[position + 1].startswith("-"))
        else token
        for position, token in enumerate(argv)
    ]


def _apply_train_flag_rules(values: dict) -> None:
    """What two `train` flags mean beyond their `TrainingArguments` field (as in earlier versions of the CLI):
    `--eval-steps N` evaluates and checkpoints every N steps instead of every epoch. Without a validation split
    nothing is evaluated and no best model is kept (as `recipe.train` does), so that any `--save-strategy` works;
    with one, a checkpoint schedule that cannot keep the best model is refused with what would work. (`--bf16`
    training the head and tail in bf16 is `HasteTrainingArguments`' own rule.)"""
    if values["eval_steps"] and values["eval_strategy"] == values["save_strategy"] == "epoch":
        values.update(eval_strategy="steps", save_strategy="steps", save_steps=values["eval_steps"])
    if values["validation_fraction"] == 0:
        values.update(eval_strategy="no", load_best_model_at_end=False)
    elif values["load_best_model_at_end"] and values["save_strategy"] not in (values["eval_strategy"], "best"):
        raise UsageError(
            f"--save-strategy {values['save_strategy']} with --eval-strategy {values['eval_strategy']}: keeping the best "
            "validation model (--load-best-model-at-end, on by default) needs a checkpoint at each evaluation. Use "
            "--eval-steps N (evaluate and checkpoint every N steps), give --eval-strategy and --save-strategy the "
            "same value, pass --load-best-model-at-end false (the last model is kept), or --validation-fraction 0 "
            "(no validation split: any --save-strategy works)"
        )


def parse_args(argv=None) -> argparse.Namespace:
    """Parses `haste-hf` arguments; `train` / `demo` / `group` get `args.recipe` (`RecipeArguments`) and `train` /
    `demo` `args.training` (`HasteTrainingArguments`), read from the flags and the `--config` file. A bad flag
    value, one the dataclasses refuse included, raises `UsageError` (or exits, from argparse) in one line."""
    import dataclasses

    argv = list(sys.argv[1:] if argv is None else argv)
    is_train = bool(argv) and argv[0] in ("train", "demo")
    if is_train:
        argv = _flags_given_alone([argv[0], *map(_long_flag, argv[1:])])
    config = None
    if is_train and _config_path(argv):
        config = read_config_file(_config_path(argv), field_names())  # an unknown key is refused before anything loads
        import typing

        from .recipe import RecipeArguments
        from .training_args import HasteTrainingArguments

        fields = {
            f.name: dataclass
            for dataclass in (RecipeArguments, HasteTrainingArguments)
            for f in dataclasses.fields(dataclass)
            if f.init
        }
        may_be_null = {
            name for name in config if type(None) in typing.get_args(typing.get_type_hints(fields[name])[name])
        }
    command = argv[0] if argv and argv[0] in DATACLASS_COMMANDS else None
    parser = build_parser(config, command=command)
    if config:
        check_config_values(
            _config_path(argv), config, parser._subparsers._group_actions[0].choices[argv[0]], may_be_null
        )
    args, unknown = parser.parse_known_args(argv)
    subparser = parser._subparsers._group_actions[0].choices[args.command]
    if unknown:
        subparser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if command:
        # The snapshot's flags have checked the arguments; the live parser turns them into the dataclasses' values.
        args, _ = build_parser(config, command=command, live=True).parse_known_args(argv)
    args.prog = subparser.prog
    if command:
        from .recipe import RecipeArguments

        dataclass_types = [RecipeArguments]
        if args.command != "group":
            from .training_args import HasteTrainingArguments

            dataclass_types.append(HasteTrainingArguments)
        values = vars(args)
        if args.command != "group":
            _apply_train_flag_rules(values)
        try:
            parsed = [
                dataclass(
                    **{f.name: values[f.name] for f in dataclasses.fields(dataclass) if f.init and f.name in values}
                )
                for dataclass in dataclass_types
            ]
        except ValueError as error:
            raise UsageError(error) from None
        args.recipe = parsed[0]
        if len(parsed) > 1:
            args.training = parsed[1]
    return args


# `--report-to` names whose availability check in transformers goes by another name.
_INTEGRATION_CHECK_NAMES = {"azure_ml": "azureml", "comet_ml": "comet", "flyte": "flytekit"}


def check_report_to(names: list[str]) -> None:
    """Refuses, before anything loads, a `--report-to` integration that transformers does not know or whose package
    is not installed (the Trainer would fail on it only after the data, encoder and label layout)."""
    from transformers.integrations import integration_utils

    known = integration_utils.INTEGRATION_TO_CALLBACK
    for name in names:
        if name not in known:
            raise UsageError(
                f"argument --report-to: unknown integration {name!r} (known: {', '.join(sorted(known))}, or none)"
            )
        if not getattr(integration_utils, f"is_{_INTEGRATION_CHECK_NAMES.get(name, name)}_available")():
            raise UsageError(f"argument --report-to: {name} is not installed; install it, or report to none")


def one_line(error: BaseException) -> str:
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


def _report(prog: str, message: str) -> None:
    """`message` on a line of its own on stderr: a progress bar the error interrupted is closed first."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()
    print(f"{prog}: {message}", file=sys.stderr)


def main(argv=None) -> int:
    """Runs a command. Usage errors (bad flags, paths, combinations) print one line and exit with status 2,
    before anything heavy loads where they can be told from the arguments; errors the library reports
    (bad data, a diverged run, a refused file) print their message in one line and exit with status 1.
    `HASTE_HF_DEBUG=1` shows tracebacks instead."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except UsageError as error:
        command = f" {argv[0]}" if argv and not argv[0].startswith("-") else ""
        print(f"haste-hf{command}: error: {one_line(error)}", file=sys.stderr)
        return 2
    if os.environ.get(DEBUG_VARIABLE):
        return args.handler(args)
    from .run_lock import OutputDirInUseError

    try:
        return args.handler(args)
    except UsageError as error:
        _report(args.prog, f"error: {one_line(error)}")
        return 2
    except (ValueError, TypeError, OSError, FloatingPointError, OutputDirInUseError) as error:
        _report(args.prog, f"error: {one_line(error)}")
        return 1
    except Exception as error:  # a damaged file that no caller named: the traceback shows which
        if not is_model_file_error(error):
            raise
        _report(
            args.prog,
            f"error: {one_line(error)} (a damaged or mismatched weights file; {DEBUG_VARIABLE}=1 shows which)",
        )
        return 1
    except KeyboardInterrupt:
        _report(args.prog, "interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
