# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Labels never seen in training, measured: 10% of the labels (random, stratified by frequency) are held out of
training, then added to the trained model with `model.add_labels` from their text alone, and from their text + 1 and
+ 5 examples each; against (a) the encoder's cosine similarity between a text and a label's text (zero-shot) and
(b) training from scratch with every label (the ceiling).

The held-out labels leave the label set, the training targets and the test targets the run reads; training points
left with no label are dropped from training (they stay available as examples). Examples of a held-out label are
drawn from its own training points; the negatives of the fit are 2,048 training texts tagged with no held-out label.
Both models train through `haste-hf train` with its defaults (`recipe_study.py`'s `defaults` variant, its command
line and worker), side by side on one GPU; the evaluation runs in the same worker after training.

Metrics, on the original test split:
- held-out labels: P@k and R@k (k = 1, 3, 5) of the held-out labels ranked among themselves, on the test points
  tagged with at least one of them;
- other labels: P@k of the other labels ranked among themselves, on the test points tagged with one (the added
  labels leave their scores bit-identical, so this is the held-out training's cost against the ceiling);
- overall: P@k and PSP@k of the full ranking against every label.

    python benchmarks/unseen_labels.py --data-root .device-data/debian-xmc --datasets deps tags \\
        --encoder .device-data/minilm-int8 --out results/unseen_labels
    python benchmarks/unseen_labels.py --report --out results/unseen_labels
"""

import argparse
import gzip
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


HERE = Path(__file__).resolve().parent


def _sibling(name: str):
    """A script of this folder as a module, without putting the folder on `sys.path` (its `kernels.py` would shadow
    the Hub's `kernels` package that transformers looks for)."""
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


recipe_study = _sibling("recipe_study")


KS = (1, 3, 5)
HELD_OUT_FRACTION = 0.1
NEGATIVES = 2048
TEXT_FIELDS = "title_content"
JOBS = ("heldout", "ceiling", "cosine")
# name: (examples per label, fitted against negatives)
ADDITIONS = {"text": (0, False), "text+fit": (0, True), "text+1": (1, True), "text+5": (5, True)}


# ------------------------------------------------------------------------------------------------ data


def read_rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_rows(path: Path, rows: list[dict]) -> None:
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def text_of(row: dict) -> str:
    """The text `haste-hf train --text-fields title_content` reads."""
    return f"{row['title']} {row['content']}" if row.get("content") else row["title"]


def held_out_labels(train_rows: list[dict], label_count: int, seed: int, fraction: float = HELD_OUT_FRACTION):
    """Sorted ids of `fraction` of the labels, stratified by training frequency: one label drawn at random from
    each run of `1 / fraction` labels of neighbouring frequency."""
    frequencies = np.bincount([label for row in train_rows for label in row["target_ind"]], minlength=label_count)
    by_frequency = np.argsort(-frequencies, kind="stable")
    stride = round(1 / fraction)
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(by_frequency[start : start + stride]) for start in range(0, label_count, stride)]
    return np.sort(np.asarray(chosen, dtype=np.int64))


def write_held_out_dataset(source: Path, target: Path, held_out: np.ndarray) -> None:
    """`source` without the `held_out` labels: the others renumbered in order, points left without labels dropped."""
    label_rows = read_rows(source / "lbl.json.gz")
    kept = np.setdiff1d(np.arange(len(label_rows)), held_out)
    new_id = np.full(len(label_rows), -1, dtype=np.int64)
    new_id[kept] = np.arange(kept.size)
    target.mkdir(parents=True, exist_ok=True)
    write_rows(target / "lbl.json.gz", [label_rows[label] for label in kept])
    for name in ("trn.json.gz", "tst.json.gz"):
        rows = []
        for row in read_rows(source / name):
            labels = [int(new_id[label]) for label in row["target_ind"] if new_id[label] >= 0]
            if labels:
                rows.append({**row, "target_ind": labels})
        write_rows(target / name, rows)


# ------------------------------------------------------------------------------------------------ metrics


def ranked_metrics(top: np.ndarray, truth: list[set], prefix: str) -> dict:
    """P@k and R@k of rankings `top` `[N, >= 5]` against the label sets `truth` (rows with an empty set skipped)."""
    rows = [index for index, labels in enumerate(truth) if labels]
    metrics = {f"{prefix}points": len(rows)}
    for k in KS:
        hits = np.array([len(truth[i] & set(top[i, :k].tolist())) for i in rows], dtype=np.float64)
        sizes = np.array([len(truth[i]) for i in rows], dtype=np.float64)
        metrics[f"{prefix}P@{k}"] = float((hits / k).mean()) if rows else 0.0
        metrics[f"{prefix}R@{k}"] = float((hits / sizes).mean()) if rows else 0.0
    return metrics


def restricted_tops(scores_of, column_sets: list, point_count: int, k: int = max(KS), chunk: int = 512) -> list:
    """For each array of columns in `column_sets`, the `k` best of those columns per point, from
    `scores_of(rows) -> [rows, all labels]` scored once per chunk of points."""
    import torch

    indexes = [torch.as_tensor(columns) for columns in column_sets]
    tops = [[] for _ in indexes]
    for start in range(0, point_count, chunk):
        scores = scores_of(slice(start, min(start + chunk, point_count)))
        for index, top in zip(indexes, tops):
            picked = scores[:, index.to(scores.device)]
            top.append(index[picked.topk(min(k, index.numel()), dim=1).indices.cpu()].numpy())
    return [np.concatenate(top) for top in tops]


class Evaluation:
    """The test split's texts and labels in original ids, and what each metric family ranks."""

    def __init__(self, data: Path, held_out: np.ndarray):
        from haste_hf.data import load_xmc_dataset

        dataset = load_xmc_dataset(data, text_fields=TEXT_FIELDS)
        self.dataset = dataset
        self.label_count = dataset.label_count
        self.held_out = held_out
        self.kept = np.setdiff1d(np.arange(self.label_count), held_out)
        test = dataset.splits["test"]
        self.texts = list(test["text"])
        self.labels = [set(labels) for labels in test["labels"]]
        held = set(held_out.tolist())
        self.held_truth = [labels & held for labels in self.labels]
        self.kept_truth = [labels - held for labels in self.labels]

    def propensity(self):
        from haste_hf.metrics import Propensity

        return Propensity.from_frequencies(
            self.dataset.train_label_frequencies, self.dataset.num_train_points, a=0.55, b=1.5
        )

    def overall(self, top_ids: np.ndarray) -> dict:
        from haste_hf.metrics import compute_xmc_metrics

        metrics = compute_xmc_metrics(top_ids, [sorted(s) for s in self.labels], ks=KS, propensity=self.propensity())
        return {f"overall_{name}": value for name, value in metrics.items() if name.split("@")[0] in ("P", "PSP")}

    def of_scores(self, scores_of, to_original: np.ndarray) -> dict:
        """Every metric of a model whose scores `scores_of(rows)` are over its own label ids, `to_original` mapping
        them to the dataset's."""
        position = np.full(self.label_count, -1)
        position[to_original] = np.arange(to_original.size)
        held_columns, kept_columns = position[self.held_out], position[self.kept]
        column_sets = [kept_columns, np.arange(to_original.size)]
        has_held_out = bool((held_columns >= 0).all())
        tops = restricted_tops(scores_of, column_sets + ([held_columns] if has_held_out else []), len(self.texts))
        metrics = ranked_metrics(to_original[tops[0]], self.kept_truth, "other_")
        metrics.update(self.overall(to_original[tops[1]]))
        if has_held_out:
            metrics.update(ranked_metrics(to_original[tops[2]], self.held_truth, "held_"))
        return metrics


# ------------------------------------------------------------------------------------------------ workers


def model_scores(model, features):
    """`scores_of(rows)` of a HASTE model over pooled test features."""
    import torch

    def scores_of(rows):
        with torch.no_grad():
            return model.output_layer.logits(features[rows])

    return scores_of


def evaluate_trained(folder: Path, evaluation: Evaluation, to_original: np.ndarray, batch_size: int):
    """(model, tokenizer, pooled test features, metrics) of a trained folder."""
    import torch
    from transformers import AutoTokenizer

    from haste_hf import HasteForExtremeClassification
    from haste_hf.labels.additions import embed_texts

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = HasteForExtremeClassification.from_pretrained(folder).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    max_length = min(tokenizer.model_max_length, 512)
    features = embed_texts(model, tokenizer, evaluation.texts, batch_size=batch_size, max_length=max_length)
    return model, tokenizer, features, evaluation.of_scores(model_scores(model, features), to_original)


def additions(source: Path, evaluation: Evaluation, train_rows: list[dict], seed: int):
    """The label texts of the held-out labels, their examples (up to 5 training texts each, in a fixed random
    order, so +1 is the first of +5) and the negatives (training texts tagged with no held-out label)."""
    label_texts = [row["title"] for row in read_rows(source / "lbl.json.gz")]
    held = set(evaluation.held_out.tolist())
    rng = np.random.default_rng(seed)
    points = {int(label): [] for label in evaluation.held_out}
    negatives = []
    for row in train_rows:
        tagged = held.intersection(row["target_ind"])
        for label in tagged:
            points[label].append(text_of(row))
        if not tagged:
            negatives.append(text_of(row))
    examples = [list(rng.permutation(points[int(label)])[:5]) for label in evaluation.held_out]
    negatives = [negatives[i] for i in rng.choice(len(negatives), min(NEGATIVES, len(negatives)), replace=False)]
    return [label_texts[label] for label in evaluation.held_out], examples, negatives


def heldout_worker(args) -> dict:
    import torch

    from haste_hf import HasteForExtremeClassification

    source = args.data_root / args.dataset
    held_out = np.load(args.work_dir / f"{args.dataset}-held-out.npy")
    folder = args.work_dir / f"{args.dataset}-heldout-model"
    if not (folder / "test_metrics.json").is_file():
        argv = recipe_study.command_line(
            {}, args.work_dir / f"{args.dataset}-heldout", args.encoder, folder, args.seed, args.workers, args.extra
        )
        argv[argv.index("--dataset-name") + 1] = args.dataset
        if recipe_study.run_worker(argv, args.work_dir / f"{args.dataset}-heldout-train.json") != 0:
            return {"status": "training failed"}
    evaluation = Evaluation(source, held_out)
    kept = evaluation.kept
    model, tokenizer, features, metrics = evaluate_trained(folder, evaluation, kept, args.eval_batch_size)
    results = {"before": metrics, "held_out_labels": int(held_out.size), "label_count": evaluation.label_count}
    texts, examples, negatives = additions(source, evaluation, read_rows(source / "trn.json.gz"), args.seed)
    to_original = np.concatenate([kept, held_out])
    for name, (count, fitted) in ADDITIONS.items():
        trial = HasteForExtremeClassification.from_pretrained(folder).to(features.device).eval()
        started = time.time()
        trial.add_labels(
            texts,
            examples=[values[:count] for values in examples] if count else None,
            negatives=negatives if fitted else None,
            names=[f"held-out {label}" for label in held_out],
            tokenizer=tokenizer,
            seed=args.seed,
            batch_size=args.eval_batch_size,
            max_length=min(tokenizer.model_max_length, 512),
        )
        if features.is_cuda:
            torch.cuda.synchronize()
        seconds = time.time() - started
        results[name] = {**evaluation.of_scores(model_scores(trial, features), to_original), "add_seconds": seconds}
        print(f"{args.dataset} {name}: {seconds:.1f} s, held R@5 {results[name].get('held_R@5', 0):.4f}", flush=True)
    return results


def ceiling_worker(args) -> dict:
    source = args.data_root / args.dataset
    held_out = np.load(args.work_dir / f"{args.dataset}-held-out.npy")
    folder = args.work_dir / f"{args.dataset}-ceiling-model"
    if not (folder / "test_metrics.json").is_file():
        argv = recipe_study.command_line({}, source, args.encoder, folder, args.seed, args.workers, args.extra)
        if recipe_study.run_worker(argv, args.work_dir / f"{args.dataset}-ceiling-train.json") != 0:
            return {"status": "training failed"}
    evaluation = Evaluation(source, held_out)
    every = np.arange(evaluation.label_count)
    return {"ceiling": evaluate_trained(folder, evaluation, every, args.eval_batch_size)[3]}


def cosine_worker(args) -> dict:
    """(a): the untrained encoder's cosine similarity between a test text and each held-out label's text."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    from haste_hf.modeling.defaults import DEFAULT_MAX_LENGTH
    from haste_hf.modeling.modeling_haste import pool_hidden_states

    source = args.data_root / args.dataset
    held_out = np.load(args.work_dir / f"{args.dataset}-held-out.npy")
    evaluation = Evaluation(source, held_out)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    encoder = AutoModel.from_pretrained(args.encoder).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.encoder)
    # The texts as `haste-hf train` reads them by default: at most 128 tokens.
    max_length = min(DEFAULT_MAX_LENGTH, getattr(encoder.config, "max_position_embeddings", DEFAULT_MAX_LENGTH))

    @torch.no_grad()
    def embed(texts):
        parts = []
        for start in range(0, len(texts), args.eval_batch_size):
            batch = tokenizer(
                texts[start : start + args.eval_batch_size],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            ).to(device)
            states = encoder(**batch).last_hidden_state
            parts.append(F.normalize(pool_hidden_states(states, batch["attention_mask"], "mean").float(), dim=1))
        return torch.cat(parts)

    label_texts = [row["title"] for row in read_rows(source / "lbl.json.gz")]
    label_vectors = embed([label_texts[label] for label in held_out])
    text_vectors = embed(evaluation.texts)
    (top,) = restricted_tops(
        lambda rows: text_vectors[rows] @ label_vectors.T, [np.arange(held_out.size)], len(evaluation.texts)
    )
    return {"cosine": ranked_metrics(held_out[top], evaluation.held_truth, "held_")}


WORKERS = {"heldout": heldout_worker, "ceiling": ceiling_worker, "cosine": cosine_worker}


# ------------------------------------------------------------------------------------------------ the study


def prepare(args, dataset: str) -> None:
    """The held-out label ids and the training folder without them, once per dataset and seed."""
    source = args.data_root / dataset
    held_file = args.work_dir / f"{dataset}-held-out.npy"
    if held_file.exists():
        return
    train_rows = read_rows(source / "trn.json.gz")
    held_out = held_out_labels(train_rows, len(read_rows(source / "lbl.json.gz")), args.seed)
    write_held_out_dataset(source, args.work_dir / f"{dataset}-heldout", held_out)
    np.save(held_file, held_out)


def run_study(args) -> bool:
    """Runs the jobs without a result yet, side by side; True when every one ended well."""
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    encoder = recipe_study.resolve_study_encoder(args.encoder, args.work_dir)
    for dataset in args.datasets:
        prepare(args, dataset)
    jobs = [(job, dataset) for job in args.jobs for dataset in args.datasets]
    jobs = [job for job in jobs if not (runs / f"{job[1]}__{job[0]}__s{args.seed}.json").exists()]
    trainings = sum(job != "cosine" for job, _ in jobs) or 1
    workers = max(1, (os.cpu_count() or 2) // trainings)
    started, running = time.time(), []
    for job, dataset in jobs:
        log = open(runs / f"{dataset}__{job}__s{args.seed}.log", "w")  # noqa: SIM115  (closed when its run ends)
        argv = [sys.executable, __file__, "--worker", job, "--dataset", dataset, "--data-root", str(args.data_root)]
        argv += [
            "--encoder",
            encoder,
            "--work-dir",
            str(args.work_dir),
            "--out",
            str(args.out),
            "--seed",
            str(args.seed),
        ]
        argv += [
            "--workers",
            str(workers),
            "--eval-batch-size",
            str(args.eval_batch_size),
            "--extra",
            shlex.join(args.extra),
        ]
        running.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), (job, dataset), log))
        print(f"[{time.time() - started:6.0f} s] started {job} {dataset}", flush=True)
    try:
        for process, job, log in running:
            try:
                process.wait(timeout=max(1, args.budget_s - (time.time() - started)))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
            print(f"[{time.time() - started:6.0f} s] {job} exit {process.returncode}", flush=True)
    finally:
        for process, _, _ in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return all(process.returncode == 0 for process, _, _ in running)


# ------------------------------------------------------------------------------------------------ report


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}"


def report(out: Path) -> str:
    by_dataset: dict = {}
    for path in sorted((out / "runs").glob("*__s*.json")):
        dataset, _, _ = path.stem.split("__")
        by_dataset.setdefault(dataset, {}).update(json.loads(path.read_text()))
    columns = [f"held_{m}@{k}" for m in ("P", "R") for k in KS] + [
        "other_P@1",
        "overall_P@1",
        "overall_P@5",
        "overall_PSP@5",
    ]
    lines = []
    for dataset, rows in sorted(by_dataset.items()):
        held = rows.get("held_out_labels")
        lines += [
            f"### {dataset}" + (f" ({held:,} of {rows['label_count']:,} labels held out)" if held else ""),
            "",
            "| model | " + " | ".join(columns) + " | add s |",
            "|---|" + "---|" * (len(columns) + 1),
        ]
        for name in ("cosine", "before", *ADDITIONS, "ceiling"):
            if name in rows:
                metrics = rows[name]
                cells = [_pct(metrics.get(column)) for column in columns]
                seconds = metrics.get("add_seconds")
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {'' if seconds is None else f'{seconds:.1f}'} |")
        targets = []
        if "cosine" in rows and "text" in rows:
            targets.append(
                f"text alone beats cosine on held-out R@5: {rows['text']['held_R@5'] > rows['cosine']['held_R@5']}"
            )
        if "ceiling" in rows and "text+5" in rows:
            share = rows["text+5"]["held_R@5"] / max(rows["ceiling"]["held_R@5"], 1e-12)
            targets.append(f"text + 5 reaches {100 * share:.0f}% of the ceiling's held-out R@5 (target >= 80%)")
            drop = 100 * (rows["ceiling"]["other_P@1"] - rows["text+5"]["other_P@1"])
            targets.append(f"other labels' P@1 {drop:+.2f} below the ceiling (target <= 0.2)")
        lines += ["", *(f"- {target}" for target in targets), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, help="Folder holding the datasets (XMC raw-text JSON format).")
    parser.add_argument("--datasets", nargs="+", default=["deps", "tags"])
    parser.add_argument(
        "--encoder", default="minilm", help="Encoder id or folder (an int8_transit.py one is unpacked)."
    )
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument(
        "--budget-s", type=float, default=560, help="Kill the runs still going after this many seconds."
    )
    parser.add_argument(
        "--extra", type=shlex.split, default=[], help="Flags added to both trainings ('--max-steps 2')."
    )
    parser.add_argument(
        "--work-dir", type=Path, default=Path("/tmp/unseen-labels"), help="Data and models kept between calls."
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "unseen_labels")
    parser.add_argument("--report", action="store_true", help="Print the tables of the results in --out, run nothing.")
    parser.add_argument("--worker", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        results = WORKERS[args.worker](args)
        path = args.out / "runs" / f"{args.dataset}__{args.worker}__s{args.seed}.json"
        path.write_text(json.dumps(results, indent=2))
        return 0 if "status" not in results else 1
    succeeded = True
    if not args.report:
        succeeded = run_study(args)
        (args.out / "table.md").write_text(report(args.out))
    print(report(args.out))
    return 0 if succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
