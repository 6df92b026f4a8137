# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Labels never seen in training, measured: 10% of the labels (random, stratified by frequency) are held out of
training, then added to the trained model with `model.add_labels` from their text alone, and from their text + 1 and
+ 5 examples each; against (a) the encoder's cosine similarity between a text and a label's text (zero-shot) and
(b) training from scratch with every label (the ceiling).

The held-out labels leave the label set, the training targets and the test targets the run reads; training points
left with no label are dropped from training (they stay available as examples). Examples of a held-out label are
drawn from its own training points; the negatives of the fit are 2,048 training texts tagged with no held-out label.
Each seed of `--seeds` draws its own held-out split and trains its own model without those labels; the ceiling
trains once and is measured against each seed's split. Every training goes through `haste-hf train` with its
defaults (`recipe_study.py`'s `defaults` variant, its command line and worker), side by side on one GPU; the
evaluation runs in the same worker after training. A trained folder is kept in `--work-dir` and not trained again.

Metrics, on the original test split:
- held-out labels: P@k and R@k (k = 1, 3, 5) of the held-out labels ranked among themselves, on the test points
  tagged with at least one of them;
- overall: P@k and PSP@k of the full ranking over old and new labels against every label: what a user sees, and
  what the targets are stated on;
- calibration: the sigmoid scores of every (test point, label) pair in bins, with the fraction of them that is true,
  old and new labels side by side; and the mean score of the true pairs by the label's training frequency.

    python benchmarks/unseen_labels.py --data-root .device-data/debian-xmc --datasets deps tags --seeds 0 1 2 \\
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
# Score bins of the calibration table, and training-frequency bins of the mean true score (old against new).
SCORE_BINS = (0.0, 0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)
FREQUENCY_BINS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1 << 62)
# The mean true score of new labels within this factor of the old ones' of the same frequency, where both have at
# least `CALIBRATION_MIN_PAIRS` true pairs.
CALIBRATION_FACTOR, CALIBRATION_MIN_PAIRS = 2.0, 20
# name: (examples per label, negatives given, fit steps (None: the default), `head` of `add_labels`). `text` calibrates on the negatives without fitting; `text, nothing else` gets
# the label texts alone (calibrated on the trained labels' texts). The modes without a suffix take `add_labels`'
# default placement (the dense head on the study's models, which have no projections); the `(tail)` modes put the
# new labels in tail groups of their own (`head=False`), what a model with projections gets.
ADDITIONS = {
    "text, nothing else": (0, False, None, None),
    "text": (0, True, 0, None),
    "text+fit": (0, True, None, None),
    "text+1": (1, True, None, None),
    "text+5": (5, True, None, None),
    "text (tail)": (0, True, 0, False),
    "text+5 (tail)": (5, True, None, False),
}


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

    def calibration(self, scores_of, to_original: np.ndarray, chunk: int = 256) -> dict:
        """The sigmoid scores of every (test point, label) pair in `SCORE_BINS`, and how many of them are true, old
        labels and held-out ones apart; the sum and count of the true pairs' scores by the label's training frequency
        (`FREQUENCY_BINS`, the original training file's counts)."""
        import torch

        device = scores_of(slice(0, 1)).device
        is_new = torch.as_tensor(np.isin(to_original, self.held_out), device=device)
        frequencies = torch.as_tensor(self.dataset.train_label_frequencies[to_original], device=device)
        frequency_bin = torch.bucketize(frequencies, torch.tensor(FREQUENCY_BINS[1:-1], device=device), right=True)
        position = np.full(self.label_count, -1)
        position[to_original] = np.arange(to_original.size)
        score_edges = torch.tensor(SCORE_BINS[1:-1], device=device)
        bins, frequency_bins = len(SCORE_BINS) - 1, len(FREQUENCY_BINS) - 1
        pairs, true_pairs = torch.zeros(2, bins, device=device), torch.zeros(2, bins, device=device)
        true_sum, true_count = (torch.zeros(2, frequency_bins, device=device, dtype=torch.float64) for _ in range(2))
        for start in range(0, len(self.texts), chunk):
            rows = slice(start, min(start + chunk, len(self.texts)))
            probabilities = torch.sigmoid(scores_of(rows).float())
            points = [
                (row, column) for row, labels in enumerate(self.labels[rows]) for column in position[list(labels)]
            ]
            points = torch.tensor([point for point in points if point[1] >= 0], dtype=torch.int64, device=device)
            truth = torch.zeros_like(probabilities, dtype=torch.bool)
            truth[points[:, 0], points[:, 1]] = True
            binned = torch.bucketize(probabilities, score_edges, right=True) + bins * is_new
            counted = torch.bincount(binned.flatten(), minlength=2 * bins).view(2, bins)
            true_binned = torch.bincount(binned[points[:, 0], points[:, 1]], minlength=2 * bins).view(2, bins)
            pairs += counted
            true_pairs += true_binned
            where = (is_new[points[:, 1]].long(), frequency_bin[points[:, 1]])
            true_sum.index_put_(where, probabilities[points[:, 0], points[:, 1]].double(), accumulate=True)
            true_count.index_put_(
                where, torch.ones(points.shape[0], dtype=torch.float64, device=device), accumulate=True
            )
        return {
            "pairs": pairs.tolist(),
            "true_pairs": true_pairs.tolist(),
            "true_score_sum": true_sum.tolist(),
            "true_count": true_count.tolist(),
        }


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


def held_out_of(args, dataset: str, seed: int) -> np.ndarray:
    return np.load(args.work_dir / f"{dataset}-s{seed}-held-out.npy")


def add_in_mode(load, name: str, added, tokenizer, seed: int, fit_steps: int | None = None, **options):
    """`(model, seconds)`: a model from `load()` with the held-out labels added in mode `name` of `ADDITIONS`, and
    the seconds `add_labels` took. `added` is `(texts, examples, negatives, held_out)` of `additions`; `fit_steps`
    replaces the default of the modes that fit (None: `add_labels`'); `options` go to `add_labels`."""
    import torch

    texts, examples, negatives, held_out = added
    count, fitted, steps, head = ADDITIONS[name]
    trial = load()
    fit_steps = fit_steps if steps is None else steps
    started = time.time()
    trial.add_labels(
        texts,
        examples=[values[:count] for values in examples] if count else None,
        negatives=negatives if fitted else None,
        names=[f"held-out {label}" for label in held_out],
        head=head,
        tokenizer=tokenizer,
        seed=seed,
        **options,
        **({} if fit_steps is None else {"fit_steps": fit_steps}),
    )
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return trial, time.time() - started


def heldout_worker(args) -> dict:
    """One seed's training without its held-out labels, then the labels added in every mode of `ADDITIONS`."""
    from haste_hf import HasteForExtremeClassification

    (seed,) = args.seeds
    source = args.data_root / args.dataset
    held_out = held_out_of(args, args.dataset, seed)
    folder = args.work_dir / f"{args.dataset}-s{seed}-heldout-model"
    if not (folder / "test_metrics.json").is_file():
        argv = recipe_study.command_line(
            {}, args.work_dir / f"{args.dataset}-s{seed}-heldout", args.encoder, folder, seed, args.workers, args.extra
        )
        argv[argv.index("--dataset-name") + 1] = args.dataset
        if recipe_study.run_worker(argv, args.work_dir / f"{args.dataset}-s{seed}-heldout-train.json") != 0:
            return {seed: {"status": "training failed"}}
    evaluation = Evaluation(source, held_out)
    kept = evaluation.kept
    model, tokenizer, features, metrics = evaluate_trained(folder, evaluation, kept, args.eval_batch_size)
    results = {"before": metrics, "held_out_labels": int(held_out.size), "label_count": evaluation.label_count}
    texts, examples, negatives = additions(source, evaluation, read_rows(source / "trn.json.gz"), seed)
    to_original = np.concatenate([kept, held_out])
    for name in ADDITIONS:
        trial, seconds = add_in_mode(
            lambda: HasteForExtremeClassification.from_pretrained(folder).to(features.device).eval(),
            name,
            (texts, examples, negatives, held_out),
            tokenizer,
            seed,
            args.fit_steps,
            batch_size=args.eval_batch_size,
            max_length=min(tokenizer.model_max_length, 512),
        )
        scores_of = model_scores(trial, features)
        results[name] = {**evaluation.of_scores(scores_of, to_original), "add_seconds": seconds}
        results[name]["calibration"] = evaluation.calibration(scores_of, to_original)
        print(f"{args.dataset} s{seed} {name}: {seconds:.1f} s, held R@5 {results[name].get('held_R@5', 0):.4f}")
    return {seed: results}


def ceiling_worker(args) -> dict:
    """The training with every label (the first seed), measured against each seed's held-out labels."""
    source = args.data_root / args.dataset
    folder = args.work_dir / f"{args.dataset}-ceiling-model"
    if not (folder / "test_metrics.json").is_file():
        argv = recipe_study.command_line({}, source, args.encoder, folder, args.seeds[0], args.workers, args.extra)
        if recipe_study.run_worker(argv, args.work_dir / f"{args.dataset}-ceiling-train.json") != 0:
            return {seed: {"status": "training failed"} for seed in args.seeds}
    results = {}
    for seed in args.seeds:
        evaluation = Evaluation(source, held_out_of(args, args.dataset, seed))
        every = np.arange(evaluation.label_count)
        results[seed] = {"ceiling": evaluate_trained(folder, evaluation, every, args.eval_batch_size)[3]}
    return results


def cosine_worker(args) -> dict:
    """(a): the untrained encoder's cosine similarity between a test text and each held-out label's text."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    from haste_hf.modeling.defaults import DEFAULT_MAX_LENGTH
    from haste_hf.modeling.modeling_haste import pool_hidden_states

    source = args.data_root / args.dataset
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
    all_labels = embed(label_texts)
    evaluations = {seed: Evaluation(source, held_out_of(args, args.dataset, seed)) for seed in args.seeds}
    text_vectors = embed(evaluations[args.seeds[0]].texts)  # the same test split for every seed
    results = {}
    for seed, evaluation in evaluations.items():
        held_out = evaluation.held_out
        label_vectors = all_labels[torch.as_tensor(held_out, device=all_labels.device)]
        (top,) = restricted_tops(
            lambda rows, labels=label_vectors: text_vectors[rows] @ labels.T,
            [np.arange(held_out.size)],
            len(evaluation.texts),
        )
        results[seed] = {"cosine": ranked_metrics(held_out[top], evaluation.held_truth, "held_")}
    return results


WORKERS = {"heldout": heldout_worker, "ceiling": ceiling_worker, "cosine": cosine_worker}


# ------------------------------------------------------------------------------------------------ the study


def prepare(args, dataset: str, seed: int) -> None:
    """The held-out label ids and the training folder without them, once per dataset and seed."""
    source = args.data_root / dataset
    held_file = args.work_dir / f"{dataset}-s{seed}-held-out.npy"
    if held_file.exists():
        return
    train_rows = read_rows(source / "trn.json.gz")
    held_out = held_out_labels(train_rows, len(read_rows(source / "lbl.json.gz")), seed)
    write_held_out_dataset(source, args.work_dir / f"{dataset}-s{seed}-heldout", held_out)
    np.save(held_file, held_out)


def result_path(out: Path, dataset: str, job: str, seed: int) -> Path:
    return out / "runs" / f"{dataset}__{job}__s{seed}.json"


def run_study(args) -> bool:
    """Runs the jobs without a result yet, side by side; True when every one ended well. A held-out job per dataset
    and seed, a ceiling and a cosine job per dataset (each over every seed)."""
    runs = args.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    encoder = recipe_study.resolve_study_encoder(args.encoder, args.work_dir)
    for dataset in args.datasets:
        for seed in args.seeds:
            prepare(args, dataset, seed)
    jobs = []
    for dataset in args.datasets:
        for job in args.jobs:
            for seeds in [[seed] for seed in args.seeds] if job == "heldout" else [args.seeds]:
                if not all(result_path(args.out, dataset, job, seed).exists() for seed in seeds):
                    jobs.append((job, dataset, seeds))
    trainings = sum(job != "cosine" for job, _, _ in jobs) or 1
    workers = max(1, (os.cpu_count() or 2) // trainings)
    started, running = time.time(), []
    for job, dataset, seeds in jobs:
        tag = f"{dataset}__{job}__s{'-'.join(map(str, seeds))}"
        log = open(runs / f"{tag}.log", "w")  # noqa: SIM115  (closed when its run ends)
        argv = [sys.executable, __file__, "--worker", job, "--dataset", dataset, "--data-root", str(args.data_root)]
        argv += ["--encoder", encoder, "--work-dir", str(args.work_dir), "--out", str(args.out)]
        argv += ["--seeds", *map(str, seeds), "--workers", str(workers), "--eval-batch-size", str(args.eval_batch_size)]
        argv += ["--extra", shlex.join(args.extra)] + (
            [] if args.fit_steps is None else ["--fit-steps", str(args.fit_steps)]
        )
        running.append((subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), tag, log))
        print(f"[{time.time() - started:6.0f} s] started {tag}", flush=True)
    try:
        for process, tag, log in running:
            try:
                process.wait(timeout=max(1, args.budget_s - (time.time() - started)))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
            print(f"[{time.time() - started:6.0f} s] {tag} exit {process.returncode}", flush=True)
    finally:
        for process, _, _ in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    return all(process.returncode == 0 for process, _, _ in running)


# ------------------------------------------------------------------------------------------------ report


COLUMNS = ("held_P@1", "held_R@5", "overall_P@1", "overall_P@5", "overall_PSP@5")
OVERALL = ("overall_P@1", "overall_P@5", "overall_PSP@5")


def _cell(values: list) -> str:
    """`mean +- standard deviation` over the seeds, in percent."""
    if not values:
        return "-"
    values = 100 * np.asarray(values, dtype=np.float64)
    return f"{values.mean():.2f}" + (f" ± {values.std(ddof=1):.2f}" if values.size > 1 else "")


def read_runs(out: Path) -> dict:
    """`{dataset: {seed: {model: metrics, ...}}}` of every result file in `out/runs`."""
    by_dataset: dict = {}
    for path in sorted((out / "runs").glob("*__s*.json")):
        dataset, _, seed = path.stem.split("__")
        by_dataset.setdefault(dataset, {}).setdefault(int(seed[1:]), {}).update(json.loads(path.read_text()))
    return by_dataset


def _calibration_sums(runs: list, name: str) -> dict | None:
    tables = [run[name]["calibration"] for run in runs if "calibration" in run.get(name, {})]
    if not tables:
        return None
    return {key: np.sum([np.asarray(table[key]) for table in tables], axis=0) for key in tables[0]}


def calibration_lines(runs: list, name: str) -> list[str]:
    """The calibration table of one mode, the seeds pooled: score bins against the fraction true, old and new."""
    sums = _calibration_sums(runs, name)
    if sums is None:
        return []
    lines = [
        f"Calibration of `{name}` (every test point and label, seeds pooled): sigmoid score against the fraction true.",
        "",
        "| score | old pairs | old true | new pairs | new true |",
        "|---|---|---|---|---|",
    ]
    for index in range(len(SCORE_BINS) - 1):
        cells = []
        for group in (0, 1):
            pairs, true = sums["pairs"][group][index], sums["true_pairs"][group][index]
            cells += [f"{int(pairs):,}", f"{100 * true / pairs:.2f}%" if pairs else "-"]
        lines.append(f"| {SCORE_BINS[index]:.2f}-{SCORE_BINS[index + 1]:.2f} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| training frequency | true old pairs | mean score | true new pairs | mean score | new / old |",
        "|---|---|---|---|---|---|",
    ]
    for index, ratio, counts, means in frequency_ratios(sums):
        low, high = FREQUENCY_BINS[index], FREQUENCY_BINS[index + 1] - 1
        span = f"{low}-{high}" if high < 1 << 40 else f">= {low}"
        lines.append(
            f"| {span} | {int(counts[0]):,} | {means[0]:.3f} | {int(counts[1]):,} | {means[1]:.3f} | "
            + (f"{ratio:.2f}" if ratio is not None else "-")
            + " |"
        )
    return lines + [""]


def frequency_ratios(sums: dict) -> list:
    """`(bin, new / old mean true score or None, counts, means)` of each frequency bin with true pairs."""
    rows = []
    for index in range(len(FREQUENCY_BINS) - 1):
        counts = [sums["true_count"][group][index] for group in (0, 1)]
        if not any(counts):
            continue
        means = [sums["true_score_sum"][group][index] / max(count, 1) for group, count in enumerate(counts)]
        enough = min(counts) >= CALIBRATION_MIN_PAIRS and means[0] > 0
        rows.append((index, means[1] / means[0] if enough else None, counts, means))
    return rows


def target_lines(runs: list) -> list[str]:
    """The issue's targets, each on the full ranking over old and new labels, checked on every seed."""

    def values(name, column):
        return [run[name][column] for run in runs if column in run.get(name, {})]

    lines = []
    for name in ADDITIONS:
        worst = [
            min(after - before for after, before in zip(values(name, column), values("before", column)))
            for column in OVERALL
            if values(name, column)
        ]
        if worst:
            cells = ", ".join(f"{column[8:]} {100 * delta:+.2f}" for column, delta in zip(OVERALL, worst))
            lines.append(f"`{name}` never worse than before adding on any seed: {min(worst) >= 0} (worst: {cells})")
    gap = [
        (five - before) / max(ceiling - before, 1e-12)
        for five, before, ceiling in zip(
            values("text+5", "overall_PSP@5"), values("before", "overall_PSP@5"), values("ceiling", "overall_PSP@5")
        )
    ]
    if gap:
        lines.append(
            f"`text+5` closes {100 * np.mean(gap):.0f}% (min {100 * min(gap):.0f}%) of the before -> ceiling gap on "
            "overall PSP@5 (target >= 50%)"
        )
    text, cosine = values("text", "held_R@5"), values("cosine", "held_R@5")
    if text and cosine:
        ratio = np.mean(text) / max(np.mean(cosine), 1e-12)
        lines.append(f"`text` held-out R@5 is {ratio:.2f}x cosine's (target >= 1.1x)")
    five, ceiling = values("text+5", "held_R@5"), values("ceiling", "held_R@5")
    if five and ceiling:
        share = np.mean(five) / max(np.mean(ceiling), 1e-12)
        lines.append(f"`text+5` held-out R@5 is {100 * share:.0f}% of the ceiling's (target >= 50%)")
    for name in ADDITIONS:
        sums = _calibration_sums(runs, name)
        ratios = [ratio for _, ratio, _, _ in frequency_ratios(sums)] if sums is not None else []
        ratios = [ratio for ratio in ratios if ratio is not None]
        if ratios:
            within = all(1 / CALIBRATION_FACTOR <= ratio <= CALIBRATION_FACTOR for ratio in ratios)
            lines.append(
                f"`{name}`: mean score of a true new label / of a true old one of the same training frequency: "
                f"{min(ratios):.2f} to {max(ratios):.2f} (target within {CALIBRATION_FACTOR:g}x: {within})"
            )
    return lines


def report(out: Path) -> str:
    lines = []
    for dataset, by_seed in sorted(read_runs(out).items()):
        seeds = sorted(by_seed)
        runs = [by_seed[seed] for seed in seeds]
        held = runs[0].get("held_out_labels")
        lines += [
            f"### {dataset}"
            + (f" ({held:,} of {runs[0]['label_count']:,} labels held out" if held else " (")
            + f"; seeds {', '.join(map(str, seeds))}: mean ± standard deviation)",
            "",
            "| model | " + " | ".join(COLUMNS) + " | add s |",
            "|---|" + "---|" * (len(COLUMNS) + 1),
        ]
        for name in ("cosine", "before", *ADDITIONS, "ceiling"):
            present = [run[name] for run in runs if name in run]
            if present:
                cells = [_cell([metrics[column] for metrics in present if column in metrics]) for column in COLUMNS]
                seconds = [metrics["add_seconds"] for metrics in present if "add_seconds" in metrics]
                lines.append(
                    f"| {name} | " + " | ".join(cells) + f" | {f'{np.mean(seconds):.1f}' if seconds else ''} |"
                )
        lines += ["", *(f"- {line}" for line in target_lines(runs)), ""]
        for name in ADDITIONS:  # issue 36 item 4: the calibration table of every mode
            lines += calibration_lines(runs, name)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, help="Folder holding the datasets (XMC raw-text JSON format).")
    parser.add_argument("--datasets", nargs="+", default=["deps", "tags"])
    parser.add_argument(
        "--encoder", default="minilm", help="Encoder id or folder (an int8_transit.py one is unpacked)."
    )
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="One held-out split and training each.")
    parser.add_argument("--eval-batch-size", type=int, default=256)
    parser.add_argument(
        "--budget-s", type=float, default=560, help="Kill the runs still going after this many seconds."
    )
    parser.add_argument(
        "--extra", type=shlex.split, default=[], help="Flags added to both trainings ('--max-steps 2')."
    )
    parser.add_argument(
        "--fit-steps", type=int, help="Steps of the fit with negatives (default: add_labels'); a quick CPU check."
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
        for seed, result in results.items():
            result_path(args.out, args.dataset, args.worker, seed).write_text(json.dumps(result, indent=2))
        return 0 if all("status" not in result for result in results.values()) else 1
    succeeded = True
    if not args.report:
        succeeded = run_study(args)
        (args.out / "table.md").write_text(report(args.out))
    print(report(args.out))
    return 0 if succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
