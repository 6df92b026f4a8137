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
import sys
from pathlib import Path

from .configuration_haste import DEFAULT_HEAD_LABEL_FRACTION
from .recipe import DEMO_ENCODER, METRIC_KS as SUMMARY_KS, resolve_encoder  # noqa: F401  (resolve_encoder: public here too)


SUMMARY_METRICS = ("P", "PSP", "nDCG")


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
        **model_selection_arguments(args.validation_fraction > 0, args.eval_steps),
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------ commands


def command_train(args) -> int:
    from .recipe import train

    run = train(
        args.data, args.encoder, args.output_dir, training_args=training_arguments_of(args),
        head_label_fraction=args.head_fraction, **{name: getattr(args, name) for name in _RECIPE_OPTIONS},
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


def command_evaluate(args) -> int:
    model, tokenizer = load_trained(args)
    data = load_data(args)
    if args.split not in data.splits:
        raise SystemExit(f"--split {args.split!r} is not in the dataset (splits: {sorted(data.splits)}).")
    propensity = propensity_for(args, data)
    metrics = evaluate_split(model, tokenizer, data, args.split, args, propensity)
    print(format_summary(f"{args.split} metrics (%)", metrics, {"propensity": f"A={propensity.a}, B={propensity.b}"}))
    if args.output:
        Path(args.output).write_text(json.dumps(metrics, indent=2))
    return 0


def command_predict(args) -> int:
    model, tokenizer = load_trained(args)
    if args.input:
        texts = [line.rstrip("\n") for line in open(args.input, encoding="utf-8")]
    else:
        texts = load_data(args).splits[args.split]["text"]
    from .recipe import predict_top_k

    ids, scores = predict_top_k(model, tokenizer, texts, args.k, args.eval_batch_size, args.max_length)
    names = model.label_names
    with open(args.output, "w", encoding="utf-8") as f:
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


def _add_data_arguments(parser, required=False, of_trained_model=False):
    """`of_trained_model`: the flags of `evaluate` and `predict`, which default to the model's training settings."""
    group = parser.add_argument_group("data")
    saved = " (default: as in training)" if of_trained_model else ""
    group.add_argument("--data", required=required, help="Dataset folder in an Extreme Classification Repository format "
                       "(raw-text JSON lines, raw text + sparse labels, or bag-of-words). Default: the embedded demo set.")  # fmt: skip
    group.add_argument("--format", default="auto", help="Dataset format; 'auto' detects it from the file names.")
    group.add_argument("--text-fields", choices=("title", "title_content"), default=None,
                       help="Text of a JSON-lines instance: its title, or title + content. Default: title (title_content for the demo set).")  # fmt: skip
    group.add_argument("--dataset-name", default=None, help="Name for the model card and propensity presets (default: the folder name).")
    group.add_argument("--propensity-a", type=float, default=None, help="Propensity A for PSP (default: preset by dataset name).")
    group.add_argument("--propensity-b", type=float, default=None, help="Propensity B for PSP (default: preset by dataset name).")
    group.add_argument("--max-length", type=int, default=None if of_trained_model else 128,
                       help=f"Tokens per text; longer texts are truncated{saved}.")  # fmt: skip
    group.add_argument("--eval-batch-size", type=int, default=None if of_trained_model else 64,
                       help=f"Batch size of embedding, evaluation and prediction{saved}.")  # fmt: skip


def _add_structure_arguments(parser):
    group = parser.add_argument_group("output layer")
    group.add_argument("--head-fraction", type=float, default=DEFAULT_HEAD_LABEL_FRACTION, help="Share of labels (most frequent) in the dense head.")
    group.add_argument("--group-size", type=int, default=16, help="Labels per tail group G (1: per-label fan-in).")
    group.add_argument("--fan-in", type=int, default=64, help="Features F each tail label connects to.")
    group.add_argument("--head-projection-dim", type=int, default=None, help="Width of the head's projection (default: none).")
    group.add_argument("--tail-projection-dim", type=int, default=None, help="Width of the tail's projection (default: none).")
    group.add_argument("--pooling", choices=("cls", "mean", "last_token"), default=None, help="Pooling (default: by encoder family).")
    group.add_argument("--grouping", choices=("semantic", "frequency", "random"), default="semantic",
                       help="How tail labels are grouped: by label embeddings (the paper), by frequency, or at random.")  # fmt: skip
    group.add_argument("--layout-file", "--grouping-file", dest="layout_file", default=None,
                       help="A label layout saved by `haste-hf group` with the same data, --validation-fraction and --seed "
                       "(skips the head/tail split and the grouping).")  # fmt: skip
    group.add_argument("--beta", type=float, default=16, help="Semantic grouping: k-means buckets hold about beta groups.")
    group.add_argument("--seed", type=int, default=0, help="Seed of everything random.")
    group.add_argument("--validation-fraction", type=float, default=0.1,
                       help="Share of training points held out for model selection (never the test set); 0: none.")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haste-hf", description="HASTE extreme multi-label classifiers for Hugging Face Transformers.")
    commands = parser.add_subparsers(dest="command", required=True)

    for name, help_text in (
        ("train", "Train a HASTE model on a dataset (default: the embedded demo set) and evaluate it on its test split."),
        ("demo", "Train on the embedded demo set with the offline MiniLM encoder (same flags as `train`)."),
    ):
        train = commands.add_parser(name, help=help_text, description=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        _add_data_arguments(train)
        _add_structure_arguments(train)
        train.add_argument("--encoder", default=DEMO_ENCODER, help="Encoder model id or path ('minilm': the offline MiniLM package).")
        train.add_argument("--output-dir", default="haste-model", help="Where the model, tokenizer, card and checkpoints go.")
        train.add_argument("--label-texts", action="store_true", help="Add the labels' own texts as training points.")
        optim = train.add_argument_group("optimisation")
        optim.add_argument("--epochs", type=float, default=3, help="Training epochs.")
        optim.add_argument("--max-steps", type=int, default=-1, help="Stop after this many steps (overrides --epochs when > 0).")
        optim.add_argument("--batch-size", type=int, default=32, help="Training batch size per device.")
        optim.add_argument("--gradient-accumulation-steps", type=int, default=1, help="Batches per optimizer step.")
        optim.add_argument("--lr", type=float, default=5e-5, help="Encoder (AdamW) learning rate.")
        optim.add_argument("--weight-decay", type=float, default=0.01, help="Encoder weight decay.")
        optim.add_argument("--warmup", type=float, default=0.1, help="Encoder warm-up: steps, or a fraction of training if < 1.")
        optim.add_argument("--output-lr", type=float, default=0.05, help="Output layer (SGD) learning rate.")
        optim.add_argument("--output-momentum", type=float, default=0.9, help="Output layer SGD momentum.")
        optim.add_argument("--output-weight-decay", type=float, default=1e-4, help="Output layer decoupled weight decay.")
        optim.add_argument("--output-warmup", type=float, default=0.0, help="Output layer warm-up (steps, or fraction if < 1).")
        optim.add_argument("--bf16", action="store_true", help="bf16 autocast, and a bf16 output layer with stochastic rounding.")
        optim.add_argument("--rewiring-interval", type=int, default=2000, help="Steps between rewirings (0: off).")
        optim.add_argument("--rewiring-fraction", type=float, default=0.2, help="Share of (group, slot) pairs regrown per rewiring.")
        optim.add_argument("--rewiring-end", type=float, default=2 / 3, help="Last rewiring at this fraction of training.")
        optim.add_argument("--rewiring-init", choices=("zero", "random"), default="zero", help="Weights of regrown slots.")
        optim.add_argument("--logging-steps", type=int, default=20, help="Steps between loss logs.")
        optim.add_argument("--eval-steps", type=int, default=None,
                           help="Evaluate on the validation split (and checkpoint) every N steps instead of every epoch.")  # fmt: skip
        optim.add_argument("--num-workers", type=int, default=0, help="Data loader worker processes.")
        publish = train.add_argument_group("publishing")
        publish.add_argument("--push-to-hub", metavar="REPO_ID", default=None, help="Push the trained model to this Hub repository.")
        publish.add_argument("--hub-model-id", default=None, help="Repository id named in the model card.")
        publish.add_argument("--private", action="store_true", help="Create the Hub repository as private.")
        train.set_defaults(handler=command_train)
    commands.choices["demo"].set_defaults(encoder="minilm", epochs=3, batch_size=32, max_length=32, lr=1e-4,
                                          rewiring_interval=50, output_dir="haste-demo")  # fmt: skip

    evaluate = commands.add_parser("evaluate", help="Evaluate a trained model on a dataset split.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    evaluate.add_argument("--model", required=True, help="Folder (or Hub id) of a trained model.")
    evaluate.add_argument("--split", default="test", help="Split to evaluate.")
    evaluate.add_argument("--output", default=None, help="Also write the metrics to this JSON file.")
    _add_data_arguments(evaluate, of_trained_model=True)
    evaluate.set_defaults(handler=command_evaluate)

    predict = commands.add_parser("predict", help="Write the top-k labels of texts to a JSON-lines file.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    predict.add_argument("--model", required=True, help="Folder (or Hub id) of a trained model.")
    predict.add_argument("--input", default=None, help="Text file, one text per line (default: --data's --split).")
    predict.add_argument("--split", default="test", help="Dataset split to predict when no --input is given.")
    predict.add_argument("--output", required=True, help="JSON-lines file: label ids, scores and names per text.")
    predict.add_argument("-k", type=int, default=5, help="Labels per text.")
    _add_data_arguments(predict, of_trained_model=True)
    predict.set_defaults(handler=command_predict)

    group = commands.add_parser("group", help="Precompute the label layout: the head/tail split and the tail's label groups.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group.add_argument("--encoder", default=DEMO_ENCODER, help="Encoder model id or path.")
    group.add_argument("--output", required=True, help="Where to save the label layout (safetensors), for `train --layout-file`.")
    _add_data_arguments(group)
    _add_structure_arguments(group)
    group.set_defaults(handler=command_group)

    push = commands.add_parser("push", help="Publish a trained model folder to the Hub (weights, code, labels, card).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    push.add_argument("--model", required=True, help="Folder of a trained model.")
    push.add_argument("--repo-id", required=True, help="Hub repository, e.g. user/haste-model.")
    push.add_argument("--private", action="store_true", help="Create the repository as private.")
    push.add_argument("--revision", default=None, help="Branch to push to (created if missing).")
    push.add_argument("--commit-message", default="Upload HASTE model", help="Commit message.")
    push.set_defaults(handler=command_push)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
