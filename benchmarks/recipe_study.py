# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The default recipe's lever study: variants of `haste-hf train` options on real XMC datasets, several trainings
side by side on one GPU, with the tree-based peers on the same texts.

Each variant is a list of `haste-hf train` flags; each run is that command's own code path (`haste_hf.cli.main`
in a child process), so what the study measures is what a user gets with those flags. Runs share the GPU
(`--parallel` at once; MiniLM at batch 128 leaves an H100 mostly idle) and split the CPU cores between their
data loaders. The tree peers (napkinxc PLT and omikuji on TF-IDF of the same texts) train on the CPU in a
process of their own meanwhile. Every finished run leaves a JSON file in `--out/runs`, so a study may be spread
over several calls; `--report` prints the tables of everything collected (mean and standard deviation over
seeds where a variant ran with several).

    python benchmarks/recipe_study.py --data-root debian-xmc --datasets deps tags --encoder minilm \\
        --variants before bench bench+epochs10 --parallel 6 --trees --out results/recipe_study
    python benchmarks/recipe_study.py --report --out results/recipe_study
"""

import argparse
import gzip
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
KS = (1, 3, 5)
METRICS = [f"{family}@{k}" for family in ("P", "PSP") for k in KS]
# The flags every run shares: how the data is read and scored (and the evaluation batch, which changes no result).
DATA_FLAGS = [
    "--text-fields",
    "title_content",
    "--eval-batch-size",
    "256",
    "--propensity-a",
    "0.55",
    "--propensity-b",
    "1.5",
    "--report-to",
    "none",
]
# Every variant but `defaults` trains in bf16 at batch 128 (the defaults of 3049036 were fp32 at batch 32).
RECIPE_FLAGS = ["--bf16", "--batch-size", "128"]
# `benchmarks/real_data.py`'s settings: the anchor the levers move from. "rewirings" n is turned into the rewiring
# interval floor(2/3 of the run's steps / (n + 1)), as real_data.py computes it (so n + 1 rewirings happen, the last
# at the end of the window), and it depends on the run's length.
BENCH = {
    "--epochs": "5",
    "--lr": "1e-4",
    "--output-lr": "0.1",
    "--warmup": "0.1",
    "--max-length": "64",
    "--validation-fraction": "0",
    "rewirings": "5",
}
# The tail's defaults before issue 39 (one SGD rate for head and tail, no tail bias, random rows): `defaults+olddefaults`
# measures the recipe as it was, beside `defaults`, what it is now.
OLD_TAIL_DEFAULTS = {"--output-tail-lr-scale": "1", "--no-tail-bias": None, "--no-init-from-label-texts": None}
BEFORE = {"--epochs": "5", **OLD_TAIL_DEFAULTS}  # the defaults of commit 3049036 (the first row)
# name: the flags changed from the anchor (`bench+...` from BENCH; others stand alone).
LEVERS = {
    "epochs10": {"--epochs": "10"},
    "epochs15": {"--epochs": "15"},
    "epochs20": {"--epochs": "20"},
    "len128": {"--max-length": "128"},
    "len256": {"--max-length": "256"},
    "lr5e-5": {"--lr": "5e-5"},
    "lr2e-4": {"--lr": "2e-4"},
    "outlr0.05": {"--output-lr": "0.05"},
    "outlr0.2": {"--output-lr": "0.2"},
    "outlr0.4": {"--output-lr": "0.4"},
    "warmup0": {"--warmup": "0"},
    "wd0": {"--weight-decay": "0", "--output-weight-decay": "0"},
    "outwarmup0.1": {"--output-warmup": "0.1"},
    "linear": {"--lr-scheduler-type": "linear", "--output-lr-scheduler-type": "linear"},
    "val0.1": {"--validation-fraction": "0.1"},
    "labeltexts": {"--label-texts": None},
    "F128": {"--fan-in": "128"},
    "F192": {"--fan-in": "192"},
    "G8": {"--group-size": "8"},
    "G32": {"--group-size": "32"},
    "head1": {"--head-fraction": "0.01"},
    "head5": {"--head-fraction": "0.05"},
    "head10": {"--head-fraction": "0.1"},
    "proj": {"--head-projection-dim": "384", "--tail-projection-dim": "384"},
    "rewire0": {"rewirings": "0"},
    "rewire10": {"rewirings": "10"},
    "rewirefrac0.1": {"--rewiring-fraction": "0.1"},
    "rewirefrac0.4": {"--rewiring-fraction": "0.4"},
    "dense": {"--head-fraction": "1.0", "rewirings": "0"},
    # Labels from their texts (issue 31): the output layer starts from the label texts' embeddings; the labels seen
    # fewer than 5 times are grouped by their texts too.
    "labelinit": {"--init-from-label-texts": None},
    "labelinit3": {"--init-from-label-texts": None, "--label-text-init-scale": "3"},
    "labelgroup": {"--label-text-grouping-below": "5"},
    # The tail study (issue 39, benchmarks/results/tail_study/PLAN.md): the causes of the rare labels' loss, one lever
    # a hypothesis. Capacity without sparsity: a tail that reads every feature and is never rewired.
    "F384": {"--fan-in": "384", "rewirings": "0"},
    "F256": {"--fan-in": "256"},
    "G4": {"--group-size": "4"},
    "G1": {"--group-size": "1"},
    # Rare labels grouped among themselves: bands of training count (seen once / 2-5 times / more often).
    "bands1": {"--frequency-bands": "1"},
    "bands1-5": {"--frequency-bands": "1 5"},
    "bands1-5-20": {"--frequency-bands": "1 5 20"},
    # The grouping study (issue 37 item 5, `grouping_quality_call.sh`): semantic grouping against random, and the
    # group-dependent parts of training (rewiring's scope, the label-text init) beside each.
    "randomgroup": {"--grouping": "random"},
    "rewiregroup": {"--rewiring-scope": "group"},
    # The tail's learning rate as a multiple of the head's (same cosine schedule).
    "tailx0.5": {"--output-tail-lr-scale": "0.5"},
    "tailx2": {"--output-tail-lr-scale": "2"},
    "tailx4": {"--output-tail-lr-scale": "4"},
    # Rewiring scored per label (each label's |w| over its own mean); `rewire0` turns it off.
    "rewirenorm": {"--rewiring-score": "label_normalized"},
    "head0": {"--head-fraction": "0"},
    # Tail labels with a bias, as Dense's labels have (the CPU pre-check in tail_study/PLAN.md: it closed most of the
    # gap there, by keeping rare labels' false positives out of the top 5).
    "tailbias": {"--tail-bias": None},
    # The defaults before issue 39 (the three levers above made defaults): `defaults+olddefaults` is today's before.
    "olddefaults": OLD_TAIL_DEFAULTS,
}


def variant_flags(name: str) -> dict:
    """The flags of a variant: `before`, `bench`, `defaults` (no recipe flag at all: what a user gets), or
    `bench+lever[+lever...]`, `defaults+lever[+lever...]` (levers applied left to right)."""
    if name == "before":
        return dict(BEFORE)
    anchor, *levers = name.split("+")
    if anchor not in ("bench", "defaults"):
        raise ValueError(f"variant {name!r}: start from 'bench', 'before' or 'defaults'")
    flags = dict(BENCH) if anchor == "bench" else {}
    for lever in levers:
        if lever not in LEVERS:
            raise ValueError(f"variant {name!r}: no lever {lever!r} (levers: {', '.join(LEVERS)})")
        flags.update(LEVERS[lever])
    return flags


def training_points(data: Path, label_texts: bool, validation_fraction: float) -> int:
    with gzip.open(data / "trn.json.gz", "rt") as f:
        points = sum(1 for line in f if line.strip())
    points = points - math.ceil(points * validation_fraction) if validation_fraction else points
    if label_texts:
        with gzip.open(data / "lbl.json.gz", "rt") as f:
            points += sum(1 for line in f if line.strip())
    return points


def command_line(
    flags: dict, data: Path, encoder: str, output_dir: Path, seed: int, workers: int, extra=(), resume: bool = False
) -> list[str]:
    """The `haste-hf train` arguments of one run; the `rewirings` pseudo-flag becomes `--rewiring-interval`.
    `resume`: continue the run in `output_dir` from its last checkpoint instead of starting afresh."""
    flags = dict(flags)
    rewirings = flags.pop("rewirings", None)
    if rewirings is not None:
        epochs = float(flags.get("--epochs", 10))
        points = training_points(data, "--label-texts" in flags, float(flags.get("--validation-fraction", 0.1)))
        steps = math.ceil(points / 128) * epochs
        flags["--rewiring-interval"] = str(math.floor(steps * (2 / 3) / (int(rewirings) + 1)) if int(rewirings) else 0)
    argv = [
        "train",
        "--data",
        str(data),
        "--encoder",
        encoder,
        "--output-dir",
        str(output_dir),
        "--resume-from-checkpoint" if resume else "--overwrite-output-dir",
        "--seed",
        str(seed),
        "--dataset-name",
        data.name,
        "--dataloader-num-workers",
        str(workers),
        *DATA_FLAGS,
    ]
    if flags or rewirings is not None:  # `defaults`: nothing but the data
        argv += RECIPE_FLAGS
    for flag, value in flags.items():  # a value of several words is a flag of several values (`--frequency-bands 1 5`)
        argv += [flag] if value is None else [flag, *value.split()]
    return argv + list(extra)


# ------------------------------------------------------------------------------------------------ one run


def run_worker(argv: list[str], result_file: Path) -> int:
    """`haste-hf train argv` in this process; writes the test metrics, wall time and peak GPU memory."""
    import torch

    from haste_hf.cli import main

    started = time.time()
    status = main(argv)
    seconds = time.time() - started
    output_dir = Path(argv[argv.index("--output-dir") + 1])
    metrics = json.loads((output_dir / "test_metrics.json").read_text()) if status == 0 else {}
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    by_frequency = frequency_diagnosis(output_dir, Path(argv[argv.index("--data") + 1])) if status == 0 else {}
    result_file.write_text(
        json.dumps(
            {
                "status": status,
                "seconds": seconds,
                "peak_gib": peak,
                "metrics": metrics,
                "by_frequency": by_frequency,
                "argv": argv,
            }
        )
    )
    return status


def frequency_diagnosis(model_dir: Path, data: Path) -> dict:
    """Recall@5 and the shares of P@5 and PSP@5 per bucket of training frequency (`metrics_by_frequency`) of the
    trained model in `model_dir` on the test split, scored as the run scored it (its saved evaluation settings)."""
    import torch
    from transformers import AutoTokenizer

    from haste_hf import HasteForExtremeClassification
    from haste_hf.data import load_xmc_dataset
    from haste_hf.evaluation import predict_top_k, saved_evaluation_settings
    from haste_hf.metrics import Propensity, metrics_by_frequency

    settings = saved_evaluation_settings(model_dir)
    dataset = load_xmc_dataset(data, text_fields="title_content")
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    if torch.cuda.is_available():
        model = model.cuda()
    test = dataset.splits["test"]
    kwargs = {"max_length": settings["max_length"]} if "max_length" in settings else {}
    top, _ = predict_top_k(model, AutoTokenizer.from_pretrained(model_dir), test["text"], 5, 256, **kwargs)
    propensity = Propensity.from_frequencies(
        dataset.train_label_frequencies,
        dataset.num_train_points,
        a=float(DATA_FLAGS[DATA_FLAGS.index("--propensity-a") + 1]),
        b=float(DATA_FLAGS[DATA_FLAGS.index("--propensity-b") + 1]),
    )
    return metrics_by_frequency(top, test["labels"], dataset.train_label_frequencies, k=5, propensity=propensity)


# ------------------------------------------------------------------------------------------------ tree peers


def run_trees(data: Path, result_file: Path, threads: int) -> None:
    """napkinxc PLT and omikuji on TF-IDF of exactly the texts the neural runs read (title + content)."""
    sys.path.insert(0, str(HERE))
    from real_data import run_tree_peers

    from haste_hf.data import load_xmc_dataset

    dataset = load_xmc_dataset(data, text_fields="title_content")
    train, test = dataset.splits["train"], dataset.splits["test"]
    results = run_tree_peers(
        train["text"],
        train["labels"],
        test["text"],
        test["labels"],
        dataset.train_label_frequencies,
        len(train),
        0.55,
        1.5,
        threads,
    )
    result_file.write_text(json.dumps(results))


# ------------------------------------------------------------------------------------------------ the study


def resolve_study_encoder(encoder: str, scratch: Path) -> str:
    """An int8-packed folder (`int8_transit.py`) is unpacked once for every run; other names pass through."""
    sys.path.insert(0, str(HERE))
    from int8_transit import is_packed, unpack

    if os.path.isdir(encoder) and is_packed(encoder):
        return str(unpack(Path(encoder), scratch / "encoder"))
    return encoder


def parse_job(text: str) -> list[tuple[str, str, int]]:
    """`DATASET:VARIANT:SEED[,SEED...]` -> its `(variant, dataset, seed)` jobs."""
    try:
        dataset, variant, seeds = text.split(":")
        jobs = [(variant, dataset, int(seed)) for seed in seeds.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give DATASET:VARIANT:SEED[,SEED...]") from None
    variant_flags(variant)  # a misspelt lever fails before anything runs
    return jobs


def study_jobs(args) -> list[tuple[str, str, int]]:
    """`--jobs` as given, else every variant on every dataset with every seed."""
    if args.jobs:
        return [job for jobs in args.jobs for job in jobs]
    return [(variant, dataset, seed) for seed in args.seeds for variant in args.variants for dataset in args.datasets]


def run_study(args) -> None:
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="recipe-study-"))
    encoder = resolve_study_encoder(args.encoder, scratch)
    jobs = study_jobs(args)
    jobs = [job for job in jobs if not result_path(runs_dir, *job).exists() or args.rerun]
    # The longest first, so the last wave is not one long run alone.
    jobs.sort(key=lambda job: -float(variant_flags(job[0]).get("--epochs", 10)))
    workers = max(1, (os.cpu_count() or 2) - args.tree_threads) // args.parallel
    trees = []
    if args.trees:
        for dataset in sorted({dataset for _, dataset, _ in study_jobs(args)}):
            tree_file = runs_dir / f"{dataset}__trees.json"
            if not tree_file.exists():
                trees.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            __file__,
                            "--tree-worker",
                            str(args.data_root / dataset),
                            "--result",
                            str(tree_file),
                            "--tree-threads",
                            str(args.tree_threads),
                        ]
                    )
                )
    running = []
    started = time.time()
    while jobs or running:
        for process, job, log in list(running):
            if process.poll() is not None:
                running.remove((process, job, log))
                log.close()
                print(f"[{time.time() - started:6.0f} s] {job} exit {process.returncode}", flush=True)
        budget_left = args.budget_s - (time.time() - started)
        while jobs and len(running) < args.parallel and budget_left > args.min_start_s:
            variant, dataset, seed = job = jobs.pop(0)
            output_dir = scratch / f"{dataset}-{variant}-s{seed}"
            resume = args.resume and any(output_dir.glob("checkpoint-*"))
            argv = command_line(
                variant_flags(variant), args.data_root / dataset, encoder, output_dir, seed, workers, args.extra, resume
            )
            log = open(runs_dir / f"{dataset}__{variant}__s{seed}.log", "w")  # noqa: SIM115  (closed when its run ends)
            process = subprocess.Popen(
                [sys.executable, __file__, "--worker", "--result", str(result_path(runs_dir, *job)), "--", *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            running.append((process, job, log))
            print(f"[{time.time() - started:6.0f} s] {'resumed' if resume else 'started'} {job}", flush=True)
        if not running or budget_left <= args.min_start_s and not running:
            break
        if args.stop_s is not None and time.time() - started > args.stop_s:
            for process, job, log in running:
                process.terminate()
                process.wait()
                log.close()
                print(f"[{time.time() - started:6.0f} s] stopped {job}: its checkpoints stay in {scratch}", flush=True)
            running = []
            break
        time.sleep(2)
    if jobs:
        print(f"not started (budget): {jobs}")
    for process in trees:
        try:
            process.wait(timeout=max(1, args.budget_s + args.tree_grace_s - (time.time() - started)))
        except subprocess.TimeoutExpired:
            process.kill()
            print("tree peers: out of time (run them again with a larger --budget-s)")


def result_path(runs_dir: Path, variant: str, dataset: str, seed: int) -> Path:
    return runs_dir / f"{dataset}__{variant}__s{seed}.json"


# ------------------------------------------------------------------------------------------------ report


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    mean = 100 * statistics.mean(values)
    return f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def report(out: Path) -> str:
    runs_dir = out / "runs"
    table: dict = {}
    for path in sorted(runs_dir.glob("*__s*.json")):
        dataset, variant, _ = path.stem.split("__")
        result = json.loads(path.read_text())
        if result["status"] == 0:
            table.setdefault(dataset, {}).setdefault(variant, []).append(result)
    lines = []
    for dataset in sorted(table):
        lines += [
            f"### {dataset}",
            "",
            "| variant | seeds | " + " | ".join(METRICS) + " | minutes | peak GiB |",
            "|---|---|" + "---|" * (len(METRICS) + 2),
        ]
        for variant, results in sorted(
            table[dataset].items(), key=lambda item: -statistics.mean(r["metrics"]["P@1"] for r in item[1])
        ):
            cells = [_cell([r["metrics"][metric] for r in results]) for metric in METRICS]
            minutes = statistics.mean(r["seconds"] for r in results) / 60
            peak = max((r["peak_gib"] or 0) for r in results)
            lines.append(f"| {variant} | {len(results)} | " + " | ".join(cells) + f" | {minutes:.1f} | {peak:.2f} |")
        tree_file = runs_dir / f"{dataset}__trees.json"
        for tree in json.loads(tree_file.read_text()) if tree_file.exists() else []:
            if tree["status"] == "ok":
                cells = [_cell([tree["metrics"][metric]]) for metric in METRICS]
                lines.append(
                    f"| {tree['name']} | 1 | " + " | ".join(cells) + f" | {tree['train_seconds'] / 60:.1f} (CPU) | - |"
                )
        lines.append("")
        lines += frequency_report(dataset, table[dataset])
    return "\n".join(lines)


def frequency_report(dataset: str, variants: dict) -> list[str]:
    """Per variant and bucket of training frequency: R@5, the share of PSP@5 and the share of the top-5 slots (mean
    over seeds), for the variants whose runs recorded `by_frequency`."""
    diagnosed = {name: runs for name, runs in variants.items() if all(r.get("by_frequency") for r in runs)}
    if not diagnosed:
        return []
    buckets = list(next(iter(diagnosed.values()))[0]["by_frequency"])
    first = next(iter(diagnosed.values()))[0]["by_frequency"]
    lines = [
        f"#### {dataset}: by training frequency (R@5 / share of PSP@5 / share of the top-5 slots, %)",
        "",
        "| variant | "
        + " | ".join(f"{b} ({first[b]['labels']} labels, {first[b]['test_pairs']} pairs)" for b in buckets)
        + " |",
        "|---|" + "---|" * len(buckets),
    ]
    for name, runs in sorted(diagnosed.items()):
        cells = []
        for bucket in buckets:
            recall = statistics.mean(r["by_frequency"][bucket]["R@5"] for r in runs)
            share = statistics.mean(r["by_frequency"][bucket].get("PSP@5 share", 0.0) for r in runs)
            slots = statistics.mean(r["by_frequency"][bucket].get("top-5 share", math.nan) for r in runs)
            cells.append(f"{100 * recall:.1f} / {100 * share:.2f} / {100 * slots:.1f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, help="Folder holding the datasets (XMC raw-text format).")
    parser.add_argument("--datasets", nargs="+", default=["deps", "tags"])
    parser.add_argument(
        "--encoder", default="minilm", help="Encoder id or folder; an int8_transit.py folder is unpacked."
    )
    parser.add_argument("--variants", nargs="+", default=["before", "bench"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument(
        "--jobs",
        nargs="+",
        type=parse_job,
        help="Runs as DATASET:VARIANT:SEED[,SEED...] (instead of --datasets x --variants x --seeds).",
    )
    parser.add_argument("--parallel", type=int, default=4, help="Trainings side by side on the GPU.")
    parser.add_argument("--trees", action="store_true", help="Also train the tree peers (CPU, one process).")
    parser.add_argument("--tree-threads", type=int, default=4)
    parser.add_argument(
        "--tree-grace-s", type=float, default=60, help="How long past the budget to wait for the trees."
    )
    parser.add_argument("--budget-s", type=float, default=540, help="Start no run after this many seconds.")
    parser.add_argument("--min-start-s", type=float, default=120, help="Start no run with less budget left than this.")
    parser.add_argument(
        "--extra", type=shlex.split, default=[], help="Flags added to every run (e.g. '--max-steps 2' for a dry run)."
    )
    parser.add_argument("--rerun", action="store_true", help="Run variants that already have a result again.")
    parser.add_argument(
        "--scratch", type=Path, help="Where the runs' folders go (default: a new temporary folder); kept afterwards."
    )
    parser.add_argument(
        "--stop-s",
        type=float,
        help="Stop the runs still going after this many seconds (their last epoch's checkpoint stays in --scratch).",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="A run whose folder in --scratch holds a checkpoint continues from it: runs longer than one device call.",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "recipe_study")
    parser.add_argument("--report", action="store_true", help="Print the tables of the results in --out, run nothing.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.worker:
        return run_worker(rest[1:] if rest[:1] == ["--"] else rest, args.result)
    if args.tree_worker:
        run_trees(args.tree_worker, args.result, args.tree_threads)
        return 0
    if not args.report:
        for variant in args.variants:
            variant_flags(variant)  # a misspelt lever fails before anything runs
        import torch

        print(
            f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, {platform.node()}, "
            f"{os.cpu_count()} cores, torch {torch.__version__}"
        )
        run_study(args)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
