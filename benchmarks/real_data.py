# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE and its ablations against dense output layers and tree-based peers on a real XMC dataset.

Every neural variant fine-tunes the same encoder with the same budget (epochs, batch size, max_length,
learning rates, schedule) on the whole training split and is scored once on the test split; nothing is
selected on the test split and no validation split is used (there is no model selection). Per variant:
P@1/3/5, PSP@1/3/5 (propensities from the training split, A and B given), the peak GPU memory of training
(`torch.cuda.max_memory_allocated`, reset per variant), the mean epoch time and whether the CUDA kernels of
the sparse tail ran. The tree-based peers are napkinxc's PLT and omikuji on TF-IDF features of the same texts, trained
in a forked process on the CPU while the GPU variants train.

    python benchmarks/real_data.py --data ../shared/data/debian-xmc/deps --encoder path/to/all-MiniLM-L6-v2 \
        --output-dir results/deps
    python benchmarks/real_data.py ... --limit-train 500 --limit-test 200 --epochs 1   # a quick dry run

Variants (`--variants`, default all, in this order except fixed_fan_in, which runs last):
  haste           head = 3% most frequent labels, tail G=16, F=64 of d, semantic grouping, rewiring
  no_head         as haste, head = 0 labels (everything in the sparse tail)
  random_grouping as haste, random grouping of the tail
  fixed_fan_in    as haste, G=1: every tail label owns its own F=64 support (unshared fixed fan-in)
  dense_bottleneck every label in a dense head on a learned projection of h to --bottleneck-dim features
  dense           every label in a dense head on h
"""

import argparse
import concurrent.futures
import gc
import json
import math
import multiprocessing
import os
import platform
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from haste_hf.modeling.configuration_haste import DEFAULT_HEAD_LABEL_FRACTION


KS = (1, 3, 5)
# fixed_fan_in last: its G = 1 tail runs on the slower PyTorch path, so a time budget cuts it first.
VARIANTS = ("haste", "no_head", "random_grouping", "dense_bottleneck", "dense", "fixed_fan_in")


def variant_structure(name: str, args) -> dict:
    """Head size (fraction or count), group size, grouping strategy, projection and rewiring of a variant."""
    sparse = {"group_size": args.group_size, "fan_in": args.fan_in, "rewiring": True, "head_projection_dim": None}
    dense = {
        "grouping": None,
        "group_size": args.group_size,
        "fan_in": args.fan_in,
        "rewiring": False,
        "head_label_fraction": 1.0,
    }
    return {
        "haste": {**sparse, "head_label_fraction": args.head_label_fraction, "grouping": "semantic"},
        "no_head": {**sparse, "head_label_fraction": 0.0, "grouping": "semantic"},
        "random_grouping": {**sparse, "head_label_fraction": args.head_label_fraction, "grouping": "random"},
        # G = 1: no label shares a support, so the order of the tail is irrelevant.
        "fixed_fan_in": {
            **sparse,
            "head_label_fraction": args.head_label_fraction,
            "grouping": "frequency",
            "group_size": 1,
        },
        "dense_bottleneck": {**dense, "head_projection_dim": args.bottleneck_dim},
        "dense": {**dense, "head_projection_dim": None},
    }[name]


# ------------------------------------------------------------------------------------------------ tree peers


TREE_PEERS = ("napkinxc PLT (TF-IDF)", "omikuji (TF-IDF)")


def fit_napkinxc_plt(x_train, train_labels, x_test, threads: int, k: int) -> list[list[int]]:
    from napkinxc.models import PLT

    with tempfile.TemporaryDirectory() as model_dir:
        model = PLT(model_dir, threads=threads, seed=0)
        model.fit(x_train, [list(labels) for labels in train_labels])
        return model.predict(x_test, top_k=k)


def fit_omikuji(x_train, train_labels, x_test, threads: int, k: int) -> list[list[int]]:
    """omikuji's default model (a Parabel-like tree of linear classifiers, its authors' defaults); it trains from
    a file in the repository's sparse format."""
    import omikuji

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "train.txt")
        with open(path, "w") as f:
            f.write(
                f"{x_train.shape[0]} {x_train.shape[1]} {1 + max(max(labels, default=0) for labels in train_labels)}\n"
            )
            for row, labels in enumerate(train_labels):
                features = x_train[row]
                pairs = " ".join(f"{i}:{v:.6g}" for i, v in zip(features.indices, features.data))
                f.write(f"{','.join(map(str, labels))} {pairs}\n")
        model = omikuji.Model.train_on_data(path, omikuji.Model.default_hyper_param(), n_threads=threads)
    return [
        [label for label, _ in model.predict(list(zip(x_test[row].indices, x_test[row].data)), top_k=k)]
        for row in range(x_test.shape[0])
    ]


def run_tree_peers(train_texts, train_labels, test_texts, test_labels, frequencies, num_train, a, b, threads):
    """napkinxc's PLT and omikuji on the same TF-IDF features of the same texts; runs in a child process (CPU)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from haste_hf.metrics import Propensity, compute_xmc_metrics

    started = time.time()
    vectorizer = TfidfVectorizer(
        sublinear_tf=True, ngram_range=(1, 2), min_df=2, max_features=200_000, dtype=np.float32
    )
    x_train = vectorizer.fit_transform(train_texts)
    x_test = vectorizer.transform(test_texts)
    featurize_seconds = time.time() - started
    propensity = Propensity.from_frequencies(frequencies, num_train, a=a, b=b)
    results = []
    for name, fit in zip(TREE_PEERS, (fit_napkinxc_plt, fit_omikuji)):
        started = time.time()
        try:
            predictions = fit(x_train, train_labels, x_test, threads, max(KS))
        except Exception as error:  # noqa: BLE001  a peer that fails is recorded, the other still runs
            results.append({"name": name, "status": f"failed ({type(error).__name__}: {str(error)[:120]})"})
            continue
        train_seconds = time.time() - started
        top_ids = np.full((len(predictions), max(KS)), -1, dtype=np.int64)
        for row, labels in enumerate(predictions):
            top_ids[row, : len(labels)] = labels
        results.append(
            {
                "name": name,
                "status": "ok",
                "metrics": compute_xmc_metrics(top_ids, test_labels, ks=KS, propensity=propensity),
                "peak_gpu_memory_gib": None,
                "train_seconds": train_seconds,
                "featurize_seconds": featurize_seconds,
                "tfidf_features": x_train.shape[1],
                "kernels": "-",
            }
        )
    return results


# ------------------------------------------------------------------------------------------------ neural variants


def build_kernels(device) -> dict:
    """JIT-build the tail's CUDA kernels before any variant (so no epoch time includes the build)."""
    if device.type != "cuda":
        return {"available": False, "build_seconds": 0.0}
    from haste_hf.kernels import ops as kernels

    started = time.time()
    available = kernels.is_available()
    return {"available": available, "build_seconds": time.time() - started}


class KernelCallCounter:
    """Counts calls of the CUDA kernels' `group_sparse_linear` (what `haste_hf.modeling.sparse_ops` dispatches to)."""

    def __init__(self):
        from haste_hf.modeling import sparse_ops

        self.calls = 0
        self.module = sparse_ops._KERNELS
        if self.module is not None:
            original = self.module.group_sparse_linear

            def counted(*args, **kwargs):
                self.calls += 1
                return original(*args, **kwargs)

            self.module.group_sparse_linear = counted


def make_epoch_timer(device):
    import torch
    from transformers import TrainerCallback

    class EpochTimer(TrainerCallback):
        def __init__(self):
            self.seconds = []

        def _sync(self):
            if device.type == "cuda":
                torch.cuda.synchronize()

        def on_epoch_begin(self, args, state, control, **kwargs):
            self._sync()
            self.started = time.time()

        def on_epoch_end(self, args, state, control, **kwargs):
            self._sync()
            self.seconds.append(time.time() - self.started)

    return EpochTimer()


def train_variant(name, args, data, frequencies, embeddings, device, counter, steps_per_epoch):
    """One variant through the package's training recipe (`haste_hf.recipe.train`), with its own layout."""
    import torch

    from haste_hf.evaluation import evaluate_split
    from haste_hf.labels.layout import LabelLayout
    from haste_hf.recipe import train

    structure = variant_structure(name, args)
    layout = LabelLayout.from_frequencies(
        frequencies,
        structure["group_size"],
        head_label_fraction=structure["head_label_fraction"],
        strategy=structure["grouping"] or "frequency",
        label_embeddings=embeddings,
        seed=args.seed,
        split_fingerprint=args.split_fingerprint,
        train_points=len(data.splits["train"]),
    )
    total_steps = steps_per_epoch * args.epochs
    # A few rewirings inside the default window (the first two thirds of training).
    rewiring_interval = max(1, math.floor(total_steps * (2 / 3) / (args.rewirings + 1))) if structure["rewiring"] else 0
    bf16 = device.type == "cuda"
    training_args = dict(
        output_dir=os.path.join(args.work_dir, name),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size,
        learning_rate=args.lr,
        warmup_steps=args.warmup,
        weight_decay=0.01,
        output_learning_rate=args.output_lr,
        output_momentum=0.9,
        output_layer_dtype="bfloat16" if bf16 else None,
        bf16=bf16,
        rewiring_interval=rewiring_interval,
        logging_steps=max(1, steps_per_epoch // 4),
        seed=args.seed,
        dataloader_num_workers=args.num_workers,
        use_cpu=device.type != "cuda",
        disable_tqdm=True,
        eval_strategy="no",
        save_strategy="no",
    )
    timer = make_epoch_timer(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    calls_before = counter.calls
    run = train(
        data,
        args.encoder,
        training_args=training_args,
        layout=layout,
        callbacks=[timer],
        save=False,
        evaluate_test=False,
        validation_fraction=0,
        fan_in=structure["fan_in"],
        head_projection_dim=structure["head_projection_dim"],
        max_length=args.max_length,
        propensity_a=args.propensity_a,
        propensity_b=args.propensity_b,
    )
    kernel_calls = counter.calls - calls_before
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    model, trainer = run.model, run.trainer
    started = time.time()
    metrics = evaluate_split(
        model,
        run.tokenizer,
        data,
        "test",
        run.propensity,
        batch_size=args.eval_batch_size,
        max_length=args.max_length,
        ks=KS,
    )
    predict_seconds = time.time() - started
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    rewirings = [entry["rewired_pairs"] for entry in trainer.state.log_history if "rewired_pairs" in entry]
    result = {
        "name": name,
        "status": "ok",
        "metrics": metrics,
        "peak_gpu_memory_gib": peak,
        "epoch_seconds": timer.seconds,
        "mean_epoch_seconds": float(np.mean(timer.seconds)) if timer.seconds else None,
        # The first epoch also pays one-off costs (CUDA context warm-up, first kernel launches).
        "mean_epoch_seconds_after_first": float(np.mean(timer.seconds[1:])) if len(timer.seconds) > 1 else None,
        "train_seconds": run.training_seconds,
        "predict_seconds": predict_seconds,
        "steps": trainer.state.global_step,
        "head_labels": layout.head_label_count,
        "tail_labels": layout.tail_label_count,
        "group_size": layout.group_size if layout.tail_label_count else None,
        "fan_in": structure["fan_in"] if layout.tail_label_count else None,
        "grouping": structure["grouping"],
        "head_projection_dim": structure["head_projection_dim"],
        "rewiring_interval": rewiring_interval,
        "rewirings": len(rewirings),
        "rewired_pairs": rewirings,
        "kernel_calls": kernel_calls,
        "kernels": "yes" if kernel_calls else ("no" if layout.tail_label_count else "-"),
        "parameters_output_layer": sum(p.numel() for n, p in model.named_parameters() if not n.startswith("encoder.")),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }
    del run, trainer, model
    return result


# ------------------------------------------------------------------------------------------------ report


def format_table(results) -> str:
    header = [
        "variant",
        *(f"P@{k}" for k in KS),
        *(f"PSP@{k}" for k in KS),
        "peak GPU mem (GiB)",
        "epoch (s): mean / after the first",
        "CUDA kernels",
        "rewirings",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        if result["status"] != "ok":
            lines.append(f"| {result['name']} | {result['status']} | " + " | ".join(["-"] * (len(header) - 2)) + " |")
            continue
        metrics = result["metrics"]
        cells = [result["name"]]
        cells += [f"{100 * metrics[f'P@{k}']:.2f}" for k in KS]
        cells += [f"{100 * metrics[f'PSP@{k}']:.2f}" for k in KS]
        peak = result.get("peak_gpu_memory_gib")
        cells.append("-" if peak is None else f"{peak:.2f}")
        epoch = result.get("mean_epoch_seconds")
        later = result.get("mean_epoch_seconds_after_first")
        if epoch is None:
            cells.append(f"(fit {result['train_seconds']:.1f} on the CPU)")
        else:
            cells.append(f"{epoch:.1f}" + ("" if later is None else f" / {later:.1f}"))
        cells.append(result.get("kernels", "-"))
        cells.append(str(result["rewirings"]) if result.get("rewiring_interval") else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(results, settings, output_dir: Path) -> None:
    (output_dir / "results.json").write_text(
        json.dumps({"settings": settings, "results": results}, indent=1, default=float)
    )
    (output_dir / "table.md").write_text(format_table(results) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Dataset folder (raw-text JSON lines: trn/tst/lbl.json.gz).")
    parser.add_argument("--encoder", required=True, help="Encoder folder or model id.")
    parser.add_argument("--output-dir", required=True, help="Where results.json, table.md go.")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--no-tree", action="store_true", help="Skip the tree peers (napkinxc PLT, omikuji).")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--eval-batch-size", type=int, default=512)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4, help="Encoder (AdamW) learning rate.")
    parser.add_argument("--output-lr", type=float, default=0.1, help="Output layer (SGD, momentum 0.9) learning rate.")
    parser.add_argument("--warmup", type=float, default=0.1, help="Encoder warm-up fraction.")
    parser.add_argument("--head-label-fraction", "--head-fraction", type=float, default=DEFAULT_HEAD_LABEL_FRACTION)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--fan-in", type=int, default=64)
    parser.add_argument("--bottleneck-dim", type=int, default=64)
    parser.add_argument("--rewirings", type=int, default=4, help="Rewirings in the first two thirds of training.")
    parser.add_argument("--propensity-a", type=float, default=0.55)
    parser.add_argument("--propensity-b", type=float, default=1.5)
    parser.add_argument("--limit-train", type=int, default=None, help="Use only the first N training points.")
    parser.add_argument("--limit-test", type=int, default=None, help="Use only the first N test points.")
    parser.add_argument("--num-workers", type=int, default=4, help="Data loader workers (tokenization).")
    parser.add_argument("--tree-threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="Seconds after which the variants not yet started are skipped (recorded as such).",
    )
    args = parser.parse_args(argv)

    import torch
    import transformers

    from haste_hf import compute_label_embeddings
    from haste_hf.data import load_xmc_dataset
    from haste_hf.labels.layout import count_labels

    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    args.work_dir = tempfile.mkdtemp(prefix="haste-real-data-")
    started_all = time.time()

    data = load_xmc_dataset(args.data, text_fields="title_content", cache_dir=os.path.join(args.work_dir, "arrow"))
    train_split, test_split = data.splits["train"], data.splits["test"]
    if args.limit_train:
        train_split = train_split.select(range(min(args.limit_train, len(train_split))))
    if args.limit_test:
        data.splits["test"] = test_split = test_split.select(range(min(args.limit_test, len(test_split))))
    data.splits["train"] = train_split
    frequencies, args.split_fingerprint, _ = count_labels(train_split, data.label_count)
    # Propensities from the training points used (the recipe reads them from here).
    data.train_label_frequencies, data.num_train_points = frequencies, len(train_split)
    print(
        f"{args.data}: {len(train_split):,} train, {len(test_split):,} test, {data.label_count:,} labels "
        f"({int((frequencies > 0).sum()):,} seen in the training points used)",
        flush=True,
    )

    # The tree peer forks before CUDA starts and trains on the CPU while the GPU variants run.
    tree_future = None
    if not args.no_tree:
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
        tree_future = pool.submit(
            run_tree_peers,
            list(train_split["text"]),
            list(train_split["labels"]),
            list(test_split["text"]),
            list(test_split["labels"]),
            frequencies,
            len(train_split),
            args.propensity_a,
            args.propensity_b,
            args.tree_threads,
        )

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "CPU"
    kernel_build = build_kernels(device)
    print(
        f"device: {device_name}; CUDA kernels available: {kernel_build['available']} "
        f"(build/load {kernel_build['build_seconds']:.1f} s)",
        flush=True,
    )
    counter = KernelCallCounter()

    def settings():
        return {
            "device": device_name,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "data": args.data,
            "encoder": args.encoder,
            "train_points": len(train_split),
            "test_points": len(test_split),
            "labels": data.label_count,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "lr": args.lr,
            "output_lr": args.output_lr,
            "warmup": args.warmup,
            "bf16": device.type == "cuda",
            "propensity": {"A": args.propensity_a, "B": args.propensity_b},
            "kernel_build": kernel_build,
            "label_embedding_seconds": embedding_seconds,
            "total_seconds": time.time() - started_all,
        }

    needs_embeddings = any(variant_structure(name, args)["grouping"] == "semantic" for name in args.variants)
    embeddings, embedding_seconds = None, 0.0
    if needs_embeddings:
        from transformers import AutoModel, AutoTokenizer

        started = time.time()
        encoder = AutoModel.from_pretrained(args.encoder, dtype=torch.float32).to(device)
        embeddings = compute_label_embeddings(
            encoder,
            train_split["text"],
            train_split["labels"],
            data.label_count,
            tokenizer=AutoTokenizer.from_pretrained(args.encoder),
            batch_size=args.eval_batch_size,
            max_length=args.max_length,
        )
        embedding_seconds = time.time() - started
        del encoder
        print(f"label embeddings for semantic grouping: {embedding_seconds:.1f} s", flush=True)

    steps_per_epoch = math.ceil(len(train_split) / args.batch_size)
    results = []
    for name in args.variants:
        print(f"\n=== {name}: {variant_structure(name, args)}", flush=True)
        if args.time_budget and time.time() - started_all > args.time_budget:
            results.append({"name": name, "status": f"skipped (past the {args.time_budget:.0f} s time budget)"})
            continue
        try:
            result = train_variant(name, args, data, frequencies, embeddings, device, counter, steps_per_epoch)
        except Exception as error:  # noqa: BLE001  OOM or any other failure: record it and go on with the next variant
            traceback.print_exc()
            reason = "OOM" if isinstance(error, torch.OutOfMemoryError) else f"{type(error).__name__}: {error}"
            result = {"name": name, "status": f"failed ({reason[:120]})"}
        results.append(result)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(json.dumps(result, indent=1, default=float), flush=True)
        report(results, settings(), output_dir)  # after each variant, so a killed run still leaves a table

    if tree_future is not None:
        try:
            peers = tree_future.result()
        except Exception as error:  # noqa: BLE001  recorded in the table
            traceback.print_exc()
            peers = [
                {"name": name, "status": f"failed ({type(error).__name__}: {str(error)[:120]})"} for name in TREE_PEERS
            ]
        results.extend(peers)
        print(json.dumps(peers, indent=1, default=float), flush=True)

    report(results, settings(), output_dir)
    print("\n" + json.dumps(settings(), default=float))
    print("\n" + format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
