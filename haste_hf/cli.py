# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste-hf`: train, evaluate, predict, group and publish HASTE models from the command line.

    haste-hf demo                                   # the embedded dataset, the offline MiniLM encoder
    haste-hf train --data DIR --encoder NAME --output-dir OUT
    haste-hf evaluate --model OUT --data DIR
    haste-hf predict --model OUT --input texts.txt --output predictions.jsonl
    haste-hf group --data DIR --encoder NAME --output grouping.safetensors
    haste-hf push --model OUT --repo-id user/name
"""

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .configuration_haste import DEFAULT_HEAD_LABEL_FRACTION
from .recipe import DEMO_ENCODER, METRIC_KS as SUMMARY_KS, MINILM_ALIASES, resolve_encoder  # noqa: F401  (resolve_encoder: public here too)


SUMMARY_METRICS = ("P", "PSP", "nDCG")
DEBUG_VARIABLE = "HASTE_HF_DEBUG"
# `namespace/name` or `name`, as the Hub spells repository ids.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


class UsageError(Exception):
    """A bad argument, path or combination of them: reported in one line with exit status 2."""


# ------------------------------------------------------------------------------------------------ argument types
# Checked while parsing, before anything heavy loads; argparse reports a failure as
# "haste-hf CMD: error: argument --flag: <message>".


def _number(kind, low=None, high=None, low_open=False, high_open=False, allow=()):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if value in allow:
            return value
        if value != value or (low is not None and (value < low or (low_open and value == low))) or (
            high is not None and (value > high or (high_open and value == high))
        ):
            lower = "" if low is None else f"{'>' if low_open else '>='} {low}"
            upper = "" if high is None else f"{'<' if high_open else '<='} {high}"
            extra = "".join(f" or {value!r}" for value in allow)
            raise argparse.ArgumentTypeError(f"must be {' and '.join(filter(None, (lower, upper)))}{extra}, got {text}")
        return value

    return parse


positive_int = _number(int, low=1)
non_negative_int = _number(int, low=0)
non_negative_float = _number(float, low=0)
positive_float = _number(float, low=0, low_open=True)
fraction = _number(float, low=0, high=1)


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
    if not _HUB_ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repository id such as user/model")
    return text


def model_reference(text, namespaced=False):
    """A local model folder, or a Hub id; a path that names no folder is an error, not a Hub id. With
    `namespaced`, a Hub id must read `namespace/name` (only old canonical models, encoders all, lack one)."""
    if os.path.isdir(text) or text in MINILM_ALIASES:
        return text
    if os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a model folder or a Hub id")
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text.strip(os.sep).replace("/", "", 1)
    if looks_like_path or not _HUB_ID.match(text) or (namespaced and "/" not in text):
        raise argparse.ArgumentTypeError(f"no folder {text!r} (and it is not a Hub id such as user/model)")
    return text


def trained_model_reference(text):
    return model_reference(text, namespaced=True)


# ------------------------------------------------------------------------------------------------ helpers


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
    width = 10
    lines = [title, "-" * (8 + width * len(SUMMARY_KS))]
    lines.append(f"{'':8}" + "".join(f"{'@' + str(k):>{width}}" for k in SUMMARY_KS))
    for name in SUMMARY_METRICS:
        values = [metrics.get(f"{name}@{k}") for k in SUMMARY_KS]
        if any(value is not None for value in values):
            lines.append(f"{name:8}" + "".join(f"{'' if v is None else f'{100 * v:.2f}':>{width}}" for v in values))
    lines.append("-" * (8 + width * len(SUMMARY_KS)))
    for key, value in (extra or {}).items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def evaluate_split(model, tokenizer, data, split, args, propensity):
    from .recipe import evaluate_split

    return evaluate_split(model, tokenizer, data, split, propensity, batch_size=args.eval_batch_size, max_length=args.max_length)


# Recipe options set by `train` flags of the same name.
_RECIPE_OPTIONS = ("format", "text_fields", "label_texts", "validation_fraction", "dataset_name", "propensity_a",
                   "propensity_b", "max_length", "eval_batch_size", "group_size", "fan_in", "head_projection_dim",
                   "tail_projection_dim", "pooling", "grouping", "layout_file", "beta")  # fmt: skip


def training_arguments_of(args) -> dict:
    """`HasteTrainingArguments` fields from the `train` flags."""
    import torch

    from .recipe import model_selection_arguments

    return dict(
        output_dir=args.output_dir, num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.lr, warmup_steps=args.warmup, weight_decay=args.weight_decay,
        output_learning_rate=args.output_lr, output_momentum=args.output_momentum,
        output_weight_decay=args.output_weight_decay, output_warmup_steps=args.output_warmup,
        output_layer_dtype="bfloat16" if args.bf16 else None, bf16=args.bf16,
        rewiring_interval=args.rewiring_interval, rewiring_fraction=args.rewiring_fraction,
        rewiring_end=args.rewiring_end, rewiring_init=args.rewiring_init,
        logging_steps=args.logging_steps, seed=args.seed, report_to=[], hub_model_id=args.hub_model_id,
        dataloader_num_workers=args.num_workers, dataloader_pin_memory=torch.cuda.is_available(),
        on_non_finite=args.on_non_finite,
        **model_selection_arguments(args.validation_fraction > 0, args.eval_steps),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ commands


def command_train(args) -> int:
    from .recipe import check_output_dir, train

    try:
        check_output_dir(args.output_dir, overwrite=args.overwrite_output_dir, resume=bool(args.resume_from_checkpoint))
    except ValueError as error:
        raise UsageError(f"argument --output-dir: {error}") from None
    run = train(
        args.data, args.encoder, args.output_dir, training_args=training_arguments_of(args),
        head_label_fraction=args.head_fraction, overwrite_output_dir=args.overwrite_output_dir,
        resume_from_checkpoint=args.resume_from_checkpoint, **{name: getattr(args, name) for name in _RECIPE_OPTIONS},
    )  # fmt: skip
    layout = run.layout
    summary = format_summary(
        "Test metrics (%)",
        run.test_metrics,
        {
            "labels": f"{layout.label_count:,} (head {layout.head_label_count:,}, tail {layout.tail_label_count:,} in groups of {layout.group_size}, fan-in {args.fan_in})",
            "grouping": layout.strategy,
            "propensity": f"A={run.propensity.a}, B={run.propensity.b}",
            "steps": run.trainer.state.global_step,
            "time": f"{run.training_seconds / 60:.1f} min",
            "saved to": args.output_dir,
        },
    )
    print(summary)
    if args.push_to_hub:
        from .hub import push_to_hub

        push_to_hub(args.output_dir, args.push_to_hub, private=args.private)
    return 0


def load_trained(args):
    """The model and tokenizer of `args.model`; the data flags left unset take the values training used."""
    from transformers import AutoTokenizer

    from .modeling_haste import HasteForExtremeClassification
    from .recipe import saved_evaluation_settings

    from_training = saved_evaluation_settings(args.model) if Path(args.model).is_dir() else {}
    for name, value in from_training.items():
        if getattr(args, name, None) is None or (name == "format" and args.format == "auto"):
            setattr(args, name, value)
    args.max_length = args.max_length or 128
    args.eval_batch_size = args.eval_batch_size or 64
    model = HasteForExtremeClassification.from_pretrained(args.model).to(default_device())
    return model, AutoTokenizer.from_pretrained(args.model)


def check_split(args, data):
    if args.split not in data.splits:
        raise UsageError(f"argument --split: {args.split!r} is not a split of the dataset (splits: {', '.join(sorted(data.splits))})")


def command_evaluate(args) -> int:
    from .saving import atomic_path

    model, tokenizer = load_trained(args)
    data = load_data(args)
    check_split(args, data)
    if data.num_labels != model.config.label_count:
        raise UsageError(
            f"the model at {args.model} has {model.config.label_count:,} labels and the dataset {data.num_labels:,}: "
            "evaluate a model on the dataset it was trained for."
        )
    propensity = propensity_for(args, data)
    metrics = evaluate_split(model, tokenizer, data, args.split, args, propensity)
    print(format_summary(f"{args.split} metrics (%)", metrics, {"propensity": f"A={propensity.a}, B={propensity.b}"}))
    if args.output:
        with atomic_path(args.output) as path:
            Path(path).write_text(json.dumps(metrics, indent=2))
    return 0


def read_texts(path: str) -> list[str]:
    """One text per line (line ends removed, blank lines kept so outputs stay aligned with the input)."""
    with open(path, encoding="utf-8") as f:
        texts = f.read().splitlines()
    if not texts:
        raise UsageError(f"argument --input: {path} holds no texts (one text per line)")
    return texts


def command_predict(args) -> int:
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
    ids, scores = predict_top_k(model, tokenizer, texts, args.k, args.eval_batch_size, args.max_length)
    names = model.label_names
    with atomic_path(args.output) as path, open(path, "w", encoding="utf-8") as f:
        for row_ids, row_scores in zip(ids.tolist(), scores.tolist()):
            record = {"label_ids": row_ids, "scores": [round(s, 6) for s in row_scores]}
            if names is not None:
                record["labels"] = [names[i] for i in row_ids]
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"Wrote the top {args.k} labels of {len(texts):,} texts to {args.output}")
    return 0


def command_group(args) -> int:
    from .recipe import build_layout, load_encoder, split_validation

    data = load_data(args)
    train_split, _ = split_validation(data.splits["train"], args.validation_fraction, args.seed)
    encoder, tokenizer = load_encoder(args.encoder)
    layout = build_layout(
        train_split, data.num_labels, encoder, tokenizer, group_size=args.group_size,
        head_label_fraction=args.head_fraction, grouping=args.grouping, pooling=args.pooling, beta=args.beta,
        seed=args.seed, max_length=args.max_length, batch_size=args.eval_batch_size,
    )  # fmt: skip
    layout.save(args.output)
    print(f"{layout.describe()} -> {args.output}")
    return 0


def command_push(args) -> int:
    from .hub import push_to_hub

    url = push_to_hub(args.model, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message)
    print(f"Pushed {args.model} to {url}")
    return 0


# ------------------------------------------------------------------------------------------------ parser


class ArgumentParser(argparse.ArgumentParser):
    """Reports a usage error in one line (`haste-hf CMD: error: ...`) with exit status 2, no usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_data_arguments(parser, required=False, of_trained_model=False):
    """`of_trained_model`: the flags of `evaluate` and `predict`, which default to the model's training settings."""
    group = parser.add_argument_group("data")
    saved = " (default: as in training)" if of_trained_model else ""
    group.add_argument("--data", required=required, type=existing_folder,
                       help="Dataset folder in an Extreme Classification Repository raw-text format (JSON lines, or "
                       "raw text + sparse labels; bag-of-words data has no texts to encode). Default: the embedded demo set.")  # fmt: skip
    group.add_argument("--format", default="auto", choices=("auto", "json", "text_sparse"), help="Dataset format; 'auto' detects it from the file names.")
    group.add_argument("--text-fields", choices=("title", "title_content"), default=None,
                       help="Text of a JSON-lines instance: its title, or title + content. Default: title (title_content for the demo set).")  # fmt: skip
    group.add_argument("--dataset-name", default=None, help="Name for the model card and propensity presets (default: the folder name).")
    group.add_argument("--propensity-a", type=positive_float, default=None, help="Propensity A for PSP (default: preset by dataset name).")
    group.add_argument("--propensity-b", type=positive_float, default=None, help="Propensity B for PSP (default: preset by dataset name).")
    group.add_argument("--max-length", type=positive_int, default=None if of_trained_model else 128,
                       help=f"Tokens per text; longer texts are truncated{saved}.")  # fmt: skip
    group.add_argument("--eval-batch-size", type=positive_int, default=None if of_trained_model else 64,
                       help=f"Batch size of embedding, evaluation and prediction{saved}.")  # fmt: skip


def _add_structure_arguments(parser):
    group = parser.add_argument_group("output layer")
    group.add_argument("--head-fraction", type=fraction, default=DEFAULT_HEAD_LABEL_FRACTION, help="Share of labels (most frequent) in the dense head.")
    group.add_argument("--group-size", type=positive_int, default=16, help="Labels per tail group G (1: per-label fan-in).")
    group.add_argument("--fan-in", type=positive_int, default=64, help="Features F each tail label connects to.")
    group.add_argument("--head-projection-dim", type=positive_int, default=None, help="Width of the head's projection (default: none).")
    group.add_argument("--tail-projection-dim", type=positive_int, default=None, help="Width of the tail's projection (default: none).")
    group.add_argument("--pooling", choices=("cls", "mean", "last_token"), default=None, help="Pooling (default: by encoder family).")
    group.add_argument("--grouping", choices=("semantic", "frequency", "random"), default="semantic",
                       help="How tail labels are grouped: by label embeddings (the paper), by frequency, or at random.")  # fmt: skip
    group.add_argument("--layout-file", "--grouping-file", dest="layout_file", type=existing_file, default=None,
                       help="A label layout saved by `haste-hf group` with the same data, --validation-fraction and --seed "
                       "(skips the head/tail split and the grouping).")  # fmt: skip
    group.add_argument("--beta", type=_number(float, low=1), default=16, help="Semantic grouping: k-means buckets hold about beta groups.")
    group.add_argument("--seed", type=int, default=0, help="Seed of everything random.")
    group.add_argument("--validation-fraction", type=_number(float, low=0, high=1, high_open=True), default=0.1,
                       help="Share of training points held out for model selection (never the test set); 0: none.")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="haste-hf", description="HASTE extreme multi-label classifiers for Hugging Face Transformers.",
        epilog=f"Errors are reported in one line; set {DEBUG_VARIABLE}=1 for the traceback.",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)

    for name, help_text in (
        ("train", "Train a HASTE model on a dataset (default: the embedded demo set) and evaluate it on its test split."),
        ("demo", "Train on the embedded demo set with the offline MiniLM encoder (same flags as `train`)."),
    ):
        train = commands.add_parser(name, help=help_text, description=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _add_data_arguments(train)
        _add_structure_arguments(train)
        train.add_argument("--encoder", type=model_reference, default=DEMO_ENCODER, help="Encoder model id or path ('minilm': the offline MiniLM package).")
        train.add_argument("--output-dir", default="haste-model", help="Where the model, tokenizer, card and checkpoints go.")
        existing = train.add_mutually_exclusive_group()
        existing.add_argument("--overwrite-output-dir", action="store_true",
                              help="Replace the model and checkpoints already in --output-dir (refused without this flag).")  # fmt: skip
        existing.add_argument("--resume-from-checkpoint", nargs="?", const=True, default=None, metavar="PATH", type=existing_folder,
                              help="Continue training from the last complete checkpoint in --output-dir, or from PATH.")  # fmt: skip
        train.add_argument("--label-texts", action="store_true", help="Add the labels' own texts as training points.")
        optim = train.add_argument_group("optimisation")
        optim.add_argument("--epochs", type=positive_float, default=3, help="Training epochs.")
        optim.add_argument("--max-steps", type=_number(int, low=1, allow=(-1,)), default=-1, help="Stop after this many steps (overrides --epochs when > 0).")
        optim.add_argument("--batch-size", type=positive_int, default=32, help="Training batch size per device.")
        optim.add_argument("--gradient-accumulation-steps", type=positive_int, default=1, help="Batches per optimizer step.")
        optim.add_argument("--lr", type=non_negative_float, default=5e-5, help="Encoder (AdamW) learning rate.")
        optim.add_argument("--weight-decay", type=non_negative_float, default=0.01, help="Encoder weight decay.")
        optim.add_argument("--warmup", type=non_negative_float, default=0.1, help="Encoder warm-up: steps, or a fraction of training if < 1.")
        optim.add_argument("--output-lr", type=non_negative_float, default=0.05, help="Output layer (SGD) learning rate.")
        optim.add_argument("--output-momentum", type=_number(float, low=0, high=1, high_open=True), default=0.9, help="Output layer SGD momentum.")
        optim.add_argument("--output-weight-decay", type=non_negative_float, default=1e-4, help="Output layer decoupled weight decay.")
        optim.add_argument("--output-warmup", type=non_negative_float, default=0.0, help="Output layer warm-up (steps, or fraction if < 1).")
        optim.add_argument("--bf16", action="store_true", help="bf16 autocast, and a bf16 output layer with stochastic rounding.")
        optim.add_argument("--on-non-finite", choices=("stop", "skip"), default="stop",
                           help="A step with NaN or infinite gradients: stop training with an error, or skip its update.")  # fmt: skip
        optim.add_argument("--rewiring-interval", type=non_negative_int, default=2000, help="Steps between rewirings (0: off).")
        optim.add_argument("--rewiring-fraction", type=_number(float, low=0, high=1, low_open=True), default=0.2, help="Share of (group, slot) pairs regrown per rewiring.")
        optim.add_argument("--rewiring-end", type=fraction, default=2 / 3, help="Last rewiring at this fraction of training.")
        optim.add_argument("--rewiring-init", choices=("zero", "random"), default="zero", help="Weights of regrown slots.")
        optim.add_argument("--logging-steps", type=positive_int, default=20, help="Steps between loss logs.")
        optim.add_argument("--eval-steps", type=positive_int, default=None,
                           help="Checkpoint (and evaluate on the validation split, if any) every N steps instead of every epoch.")  # fmt: skip
        optim.add_argument("--num-workers", type=non_negative_int, default=0, help="Data loader worker processes.")
        publish = train.add_argument_group("publishing")
        publish.add_argument("--push-to-hub", metavar="REPO_ID", type=hub_id, default=None, help="Push the trained model to this Hub repository.")
        publish.add_argument("--hub-model-id", default=None, help="Repository id named in the model card.")
        publish.add_argument("--private", action="store_true", help="Create the Hub repository as private.")
        train.set_defaults(handler=command_train)
    # The demo's folder is its own: running it again replaces it.
    commands.choices["demo"].set_defaults(encoder="minilm", epochs=3, batch_size=32, max_length=32, lr=1e-4,
                                          rewiring_interval=50, output_dir="haste-demo", overwrite_output_dir=True)  # fmt: skip

    evaluate = commands.add_parser("evaluate", help="Evaluate a trained model on a dataset split.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    evaluate.add_argument("--model", required=True, type=trained_model_reference, help="Folder (or Hub id) of a trained model.")
    evaluate.add_argument("--split", default="test", help="Split to evaluate.")
    evaluate.add_argument("--output", type=output_file, default=None, help="Also write the metrics to this JSON file.")
    _add_data_arguments(evaluate, of_trained_model=True)
    evaluate.set_defaults(handler=command_evaluate)

    predict = commands.add_parser("predict", help="Write the top-k labels of texts to a JSON-lines file.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    predict.add_argument("--model", required=True, type=trained_model_reference, help="Folder (or Hub id) of a trained model.")
    predict.add_argument("--input", type=existing_file, default=None, help="Text file, one text per line (default: --data's --split).")
    predict.add_argument("--split", default="test", help="Dataset split to predict when no --input is given.")
    predict.add_argument("--output", required=True, type=output_file, help="JSON-lines file: label ids, scores and names per text.")
    predict.add_argument("-k", type=positive_int, default=5, help="Labels per text.")
    _add_data_arguments(predict, of_trained_model=True)
    predict.set_defaults(handler=command_predict)

    group = commands.add_parser("group", help="Precompute the label layout: the head/tail split and the tail's label groups.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group.add_argument("--encoder", type=model_reference, default=DEMO_ENCODER, help="Encoder model id or path.")
    group.add_argument("--output", required=True, type=output_file, help="Where to save the label layout (safetensors), for `train --layout-file`.")
    _add_data_arguments(group)
    _add_structure_arguments(group)
    group.set_defaults(handler=command_group)

    push = commands.add_parser("push", help="Publish a trained model folder to the Hub (weights, code, labels, card).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    push.add_argument("--model", required=True, type=existing_folder, help="Folder of a trained model.")
    push.add_argument("--repo-id", required=True, type=hub_id, help="Hub repository, e.g. user/haste-model.")
    push.add_argument("--private", action="store_true", help="Create the repository as private.")
    push.add_argument("--revision", default=None, help="Branch to push to (created if missing).")
    push.add_argument("--commit-message", default="Upload HASTE model", help="Commit message.")
    push.set_defaults(handler=command_push)
    return parser


def one_line(error: BaseException) -> str:
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


def main(argv=None) -> int:
    """Runs a command. Usage errors (bad flags, paths, combinations) print one line and exit with status 2,
    before anything heavy loads where they can be told from the arguments; errors the library reports
    (bad data, a diverged run, a refused file) print their message in one line and exit with status 1.
    `HASTE_HF_DEBUG=1` shows tracebacks instead."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    command_parser = parser._subparsers._group_actions[0].choices[args.command]
    if unknown:
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    prog = command_parser.prog
    if os.environ.get(DEBUG_VARIABLE):
        return args.handler(args)
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, FloatingPointError) as error:
        print(f"{prog}: error: {one_line(error)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
