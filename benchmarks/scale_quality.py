# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Quality at scale (issue 37 item 5): one epoch of `haste-hf train` with the defaults on a synthetic preset of
`scale_data.py` (the generator's texts carry their labels' words), HASTE with semantic grouping, HASTE with random
grouping and Dense (`--head-fraction 1`) side by side on one GPU, against two predictors that ignore the text: the k
most frequent training labels for every test point, and k labels drawn at random (seeded). One table: P@1/3/5 and
PSP@1/3/5 (the dataset's propensities, as `haste-hf evaluate` computes them), wall time and peak GPU memory of
each run, and the issue's targets (semantic >= Dense - 1.0 P@1, semantic >= random).

    python benchmarks/scale_quality.py --encoder /tmp/minilm --work /tmp/quality --out quality.md
    python benchmarks/scale_quality.py --scale 0.002 --encoder tiny --test-points 200 -- --max-length 32   # CPU

Each training runs under `scale.py probe` (peak GPU memory, phases) in its own process; arguments after `--` go
to every `haste-hf train`. `--budget-s` stops the runs still going at that time (their rows say so).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


HERE = Path(__file__).resolve().parent
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != str(HERE)]  # see scale.py
KS = (1, 3, 5)
COLUMNS = [f"{family}@{k}" for family in ("P", "PSP") for k in KS]
# name: (what ran, the `haste-hf train` flags beyond the defaults)
VARIANTS = {
    "HASTE semantic": ("HASTE, semantic grouping (the default)", ["--grouping", "semantic"]),
    "HASTE random": ("HASTE, random grouping", ["--grouping", "random"]),
    "Dense": ("every label in the dense head (head fraction 1)", ["--head-fraction", "1"]),
    # The grouping study (issue 37 item 5, `grouping_quality_call.sh`): which group-dependent part of training costs
    # semantic grouping its P@1. With a frozen encoder a label's logit depends on its group only through rewiring
    # (the group's shared score picks the support); the label-text init and the encoder's gradients are the others.
    "HASTE semantic, no rewiring": ("semantic grouping, rewiring off", ["--grouping", "semantic", "--rewiring-interval", "0"]),
    "HASTE random, no rewiring": ("random grouping, rewiring off", ["--grouping", "random", "--rewiring-interval", "0"]),
    "HASTE semantic, rewiring per group": ("semantic grouping, each group prunes its own weakest slots",
                                           ["--grouping", "semantic", "--rewiring-scope", "group"]),
    "HASTE semantic, label-normalised rewiring": ("semantic grouping, each label one vote in its group's score",
                                                  ["--grouping", "semantic", "--rewiring-score", "label_normalized"]),
    "HASTE semantic, random init": ("semantic grouping, no label-text init",
                                    ["--grouping", "semantic", "--no-init-from-label-texts"]),
    "HASTE random, random init": ("random grouping, no label-text init", ["--grouping", "random", "--no-init-from-label-texts"]),
    "HASTE semantic, frequency bands": ("semantic grouping inside bands of training count (<= 3, 4-6, 7+)",
                                        ["--grouping", "semantic", "--frequency-bands", "3", "6"]),
}  # fmt: skip
DEFAULT_VARIANTS = ["HASTE semantic", "HASTE random", "Dense"]


def sibling(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # scale_data's writer processes find their task function by module name
    spec.loader.exec_module(module)
    return module


def train_command(args, data: Path, encoder: str, name: str) -> list[str]:
    folder = Path(args.work) / name.replace(",", "").replace(" ", "-").lower()
    cli = ["train", "--data", str(data), "--encoder", encoder, "--output-dir", str(folder), "--overwrite-output-dir"]
    cli += ["--epochs", str(args.epochs), "--seed", str(args.seed), "--dataset-name", args.preset]
    cli += ["--dataloader-num-workers", str(args.workers), "--report-to", "none", "--save-strategy", "no"]
    cli += [*VARIANTS[name][1], *args.train_args]
    report = folder.with_suffix(".report.json")
    return [sys.executable, str(HERE / "scale.py"), "probe", "--report", str(report), "--", *cli], folder, report


def start_side_by_side(args, data: Path, encoder: str) -> dict:
    """The variants' trainings, started at once."""
    runs = {}
    for name in args.variants:
        command, folder, report = train_command(args, data, encoder, name)
        log = open(Path(args.work) / f"{folder.name}.log", "w")  # noqa: SIM115  (closed when its run ends)
        print(f"[quality] {name}: {' '.join(command)}", flush=True)
        runs[name] = dict(process=subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), log=log,
                          folder=folder, report=report, started=time.time())  # fmt: skip
    return runs


def finish_side_by_side(runs: dict, deadline: float) -> dict:
    """Per variant its exit, wall time, metrics and probe report, once every run ended or `deadline` passed."""
    while any(run["process"].poll() is None for run in runs.values()) and time.time() < deadline:
        time.sleep(2)
    results = {}
    for name, run in runs.items():
        stopped = run["process"].poll() is None
        if stopped:
            run["process"].kill()
        code = run["process"].wait()
        run["log"].close()
        metrics_file = run["folder"] / "test_metrics.json"
        results[name] = {
            "exit": "stopped at --budget-s" if stopped else code,
            "wall": time.time() - run["started"] if stopped else None,
            "metrics": json.loads(metrics_file.read_text()) if code == 0 and metrics_file.is_file() else None,
            "report": json.loads(run["report"].read_text()) if run["report"].is_file() else None,
        }
        if results[name]["report"] and not stopped:
            results[name]["wall"] = results[name]["report"]["seconds"]
        print(f"[quality] {name}: exit {results[name]['exit']}", flush=True)
    return results


def baselines(data: Path, preset: str, seed: int) -> dict:
    """P@k and PSP@k of the k most frequent training labels, and of k labels drawn at random, for every test point."""
    from haste_hf.data import load_xmc_dataset
    from haste_hf.metrics import Propensity, compute_xmc_metrics

    dataset = load_xmc_dataset(data)
    frequencies = np.asarray(dataset.train_label_frequencies)
    propensity = Propensity.from_frequencies(frequencies, dataset.num_train_points, dataset_name=preset)
    test = dataset.splits["test"]["labels"]
    k = max(KS)
    most_frequent = np.tile(np.argsort(-frequencies, kind="stable")[:k], (len(test), 1))
    generator = np.random.default_rng(seed)
    random = generator.integers(0, frequencies.size, size=(len(test), k))
    while (repeats := (np.diff(np.sort(random, axis=1), axis=1) == 0).any(axis=1)).any():  # k distinct labels a point
        random[repeats] = generator.integers(0, frequencies.size, size=(int(repeats.sum()), k))
    return {
        name: compute_xmc_metrics(top, test, ks=KS, propensity=propensity)
        for name, top in (("most frequent labels", most_frequent), ("random labels", random))
    }


def table(args, stats: dict, runs: dict, chance: dict, commit: str) -> str:
    lines = [
        f"# Quality at scale: {args.preset} x {args.scale}, one GPU, {args.epochs} epoch(s), commit {commit}",
        "",
        f"Data: {stats['train_points']:,} train / {stats['test_points']:,} test points, {stats['labels']:,} labels, "
        f"{stats['labels_per_train_point']:.2f} labels per point, {stats['labels_seen_once']:,} labels seen once. "
        f"Encoder {args.encoder}; `haste-hf train` defaults, seed {args.seed}, the {len(runs)} runs side by side on one "
        f"GPU; other train flags {' '.join(args.train_args) or '(none)'}. PSP with the {args.preset} propensities.",
        "",
        "| model | what ran | " + " | ".join(COLUMNS) + " | wall s | peak GPU GiB |",
        "|---|---|" + "---|" * (len(COLUMNS) + 2),
    ]
    for name, run in runs.items():
        metrics = run["metrics"] or {}
        cells = [f"{100 * metrics[c]:.2f}" if c in metrics else "-" for c in COLUMNS]
        peak = (run["report"] or {}).get("gpu_allocated")
        status = "" if run["exit"] == 0 else f" (FAILED: exit {run['exit']})"
        wall = f"{run['wall']:.0f}" if run["wall"] else "-"
        peak_cell = f"{peak / 2**30:.2f}" if peak else "-"
        lines.append(f"| {name} | {VARIANTS[name][0]}{status} | " + " | ".join(cells) + f" | {wall} | {peak_cell} |")
    for name, metrics in chance.items():
        cells = [f"{100 * metrics[c]:.2f}" if c in metrics else "-" for c in COLUMNS]
        lines.append(f"| {name} | ignores the text | " + " | ".join(cells) + " | - | - |")
    p1 = {name: (runs[name]["metrics"] or {}).get("P@1") if name in runs else None for name in VARIANTS}
    lines += ["", "| target | goal | measured |", "|---|---|---|"]
    if p1["HASTE semantic"] is not None and p1["Dense"] is not None:
        gap = 100 * (p1["HASTE semantic"] - p1["Dense"])
        lines.append(f"| HASTE semantic vs Dense, P@1 | >= -1.00 | {gap:+.2f} |")
    if p1["HASTE semantic"] is not None and p1["HASTE random"] is not None:
        gap = 100 * (p1["HASTE semantic"] - p1["HASTE random"])
        lines.append(f"| HASTE semantic vs HASTE random, P@1 | >= 0 | {gap:+.2f} |")
    for semantic, random in (("HASTE semantic, no rewiring", "HASTE random, no rewiring"),
                             ("HASTE semantic, random init", "HASTE random, random init")):  # fmt: skip
        if p1[semantic] is not None and p1[random] is not None:
            lines.append(f"| {semantic} vs {random}, P@1 | (diagnosis) | {100 * (p1[semantic] - p1[random]):+.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="amazon-670k")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--test-points", type=int, default=20_000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--encoder", default="minilm", help="Encoder path or id; 'tiny': a small random BERT (CPU).")
    parser.add_argument("--workers", type=int, default=4, help="Data-loader workers of each training.")
    parser.add_argument("--work", default="/tmp/haste-quality")
    parser.add_argument(
        "--budget-s", type=float, default=520.0, help="Runs still going this long after the start are stopped."
    )
    parser.add_argument(
        "--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS), help="Trainings run side by side."
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    args.train_args = train_args
    scale_data, provenance = sibling("scale_data"), sibling("provenance")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    data = work / args.preset  # the folder's name is the dataset's: its propensities
    stats = scale_data.generate(data, args.preset, args.scale, args.test_points, args.seed)
    print(f"[quality] data: {stats['labels']:,} labels in {time.time() - started:.0f} s", flush=True)
    encoder = scale_data.tiny_encoder(work / "tiny-encoder") if args.encoder == "tiny" else args.encoder
    runs = start_side_by_side(args, data, encoder)
    chance = baselines(data, args.preset, args.seed)  # while the runs train
    runs = finish_side_by_side(runs, started + args.budget_s)
    text = table(args, stats, runs, chance, provenance.tree_commit())
    if args.json:
        Path(args.json).write_text(json.dumps({"stats": stats, "runs": runs, "chance": chance}, indent=1))
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
