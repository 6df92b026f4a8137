# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The `haste-hf` argument parser: argument types, each command's flags and defaults, and `parse_args`, which
checks the arguments before anything heavy loads."""

import argparse
import os
import sys

from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH, LAST_CHECKPOINT
from ..modeling.model_sources import HUB_ID_PATTERN, check_model_source
from .config_file import (
    check_config_values,
    read_config_file,
)
from .errors import DEBUG_VARIABLE, UsageError
from .flags import REGENERATE_COMMAND, field_names, flag_description, flag_records, flags_parser


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


def version_text() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    def installed(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return f"haste-hf {__version__} (transformers {installed('transformers')}, torch {installed('torch')})"


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
    add.add_argument(
        "--branch",
        choices=("head", "tail"),
        default=None,
        help="Where the new labels go: new rows of the dense head, or tail groups of their own (default: the head "
        "where it reads the tail's features, i.e. neither has a projection; else the tail).",
    )
    add.add_argument("--output-dir", required=True, help="Folder to save the model with the new labels to.")
    add.add_argument("--overwrite-output-dir", action="store_true", help="Replace a model already in --output-dir.")
    add.add_argument("--seed", type=int, default=0, help="Seed of the negatives' sample and the new groups.")
    _add_data_arguments(
        add,
        of_trained_model=True,
        data_help="Few-shot examples of the new labels: a dataset folder (read as --negatives) whose label ids index "
        "the entries of --labels.",
    )


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


def _add_data_arguments(parser, required=False, of_trained_model=False, data_help=None, scored=False):
    """`of_trained_model`: the flags of `evaluate` and `predict`, which default to the model's training settings;
    `data_help`: what `--data` holds for this command, where it is not the dataset to score; `scored`: the command
    computes metrics, so it takes the dataset's name and its propensity parameters too."""
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
    if scored:
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
        default=None if of_trained_model else DEFAULT_MAX_LENGTH,
        help=f"Tokens per text; longer texts are truncated{saved}.",
    )
    group.add_argument(
        "--eval-batch-size",
        type=positive_int,
        default=None if of_trained_model else DEFAULT_EVAL_BATCH_SIZE,
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

    from ..recipe_arguments import RecipeArguments

    return HfArgumentParser(RecipeArguments, add_help=False)


def _train_parser_kwargs(live=False) -> dict:
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "--config", default=None, help="A JSON or YAML file of flag values (keys: flag names with underscores)."
    )
    if live:
        from transformers import HfArgumentParser

        from ..recipe_arguments import RecipeArguments
        from ..training.training_args import HasteTrainingArguments

        fields = HfArgumentParser((RecipeArguments, HasteTrainingArguments), add_help=False)
    else:
        fields = flags_parser("RecipeArguments", "HasteTrainingArguments")
    return dict(parents=[config, fields], formatter_class=HelpFormatter)


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
        "token saved by `hf auth login` (or HF_TOKEN); log in first. Every regular file of the folder is published "
        "but checkpoints, logs and hidden files (the program's marks among them); a link is refused, and a hard link "
        "is a regular file: what it holds is published."
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
    parser.command_parsers = commands.choices  # name -> the command's parser, for its errors and its `prog`

    for name, help, demo_defaults in (("train", TRAIN_HELP, {}), ("demo", DEMO_HELP, DEMO_DEFAULTS)):
        if name != command:
            commands.add_parser(name, help=help)
            continue
        train = commands.add_parser(name, help=help, description=help + TRAIN_EPILOG, **_train_parser_kwargs(live))
        train.set_defaults(**{**train_defaults(), **demo_defaults, **(config or {})})

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
    _add_data_arguments(evaluate, of_trained_model=True, scored=True)

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
        help="Batch size of the label embeddings at full length: with a fast tokenizer the texts are sorted by length "
        "and a batch holds up to this many x --max-length padded tokens, so short texts go many to a batch.",
    )


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

        from ..recipe_arguments import RecipeArguments
        from ..training.training_args import HasteTrainingArguments

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
        check_config_values(_config_path(argv), config, flag_records(), may_be_null)
    args, unknown = parser.parse_known_args(argv)
    subparser = parser.command_parsers[args.command]
    if unknown:
        subparser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if command:
        # The snapshot's flags have checked the arguments; the live parser turns them into the dataclasses' values.
        args, unknown = build_parser(config, command=command, live=True).parse_known_args(argv)
        if unknown:  # a flag of a stale snapshot that the dataclasses no longer have: its value would be dropped
            subparser.error(
                f"unrecognized arguments: {' '.join(unknown)} (the flags' snapshot lists them; regenerate it with "
                f"{REGENERATE_COMMAND})"
            )
    args.prog = subparser.prog
    if command:
        from ..recipe_arguments import RecipeArguments

        dataclass_types = [RecipeArguments]
        if args.command != "group":
            from ..training.training_args import HasteTrainingArguments

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
