# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The product at scale: `haste-hf` itself on a synthetic dataset of the paper's label statistics
(`scale_data.py`), every stage in one run, each stage a child process.

Stages: `data` (write the dataset), `group` (`haste-hf group`: label embeddings and semantic grouping),
`train` (`haste-hf train --layout-file ... --max-steps N`: read, layout check, model, training, a checkpoint
save, the final save, the test evaluation), `resume` (`haste-hf train --resume-from-checkpoint` for more
steps), `evaluate` (`haste-hf evaluate`), `predict` (`haste-hf predict` of the test split), `export`
(`haste-hf export`, ONNX) and `reload` (the export served by `OnnxClassifier`, or without an export the saved
folder by `from_pretrained`, its top-1 checked against `predict`'s). Each command runs under a probe
(`scale.py probe`) that times its phases and reads, per phase and per process, the peak GPU memory
(`torch.cuda.max_memory_allocated` / `max_memory_reserved`) and the peak host RSS (`ru_maxrss`); the
stage's peak RSS over its process tree comes from `wait4`. `--gpus 2` runs `train` and `resume` under
torchrun (the output layer sharded by labels, the CLI's default with several processes).

    python benchmarks/scale.py --preset lf-paper2keywords-8.6m --encoder /tmp/minilm --out results/scale.md
    python benchmarks/scale.py --preset amazon-670k --scale 0.02 --encoder tiny --stages data,group,train

The table gives per stage the wall time, the peak GPU memory of the busiest process, the peak host RSS and
what the stage yields (texts/s, P@k against chance: k random labels, and the k most frequent training labels
for every text). The issue's targets are printed beside (H100, MiniLM, the CLI defaults, the 8.6M preset at
scale 1): training at peak GPU <= 10 GiB, grouping <= 5 min, a checkpoint saved in <= 60 s, and with
`--compare` (the JSON of a one-GPU run) two GPUs at a per-rank peak <= 0.6 x one GPU's and >= 1.8 x its
texts/s. Memory of data-loader workers is not in the GPU figures (they hold none) but is in the RSS.
"""

import argparse
import contextlib
import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


# Run as a script, this folder heads sys.path, and its kernels.py would shadow the `kernels` package that
# transformers probes for.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != HERE]

STAGES = ("data", "group", "train", "resume", "evaluate", "predict", "export", "reload")
GIB = 2**30
# Keys of a probe report's phases, in the order the table lists them.
TRAIN_PHASES = (
    "read",
    "layout",
    "label embeddings",
    "grouping",
    "model",
    "training",
    "checkpoint",
    "resume load",
    "save",
    "test evaluation",
)
TARGETS = {
    "train peak GPU GiB": 10.0,
    "grouping s": 300.0,
    "checkpoint s": 60.0,
    "two GPUs peak ratio": 0.6,
    "two GPUs speed-up": 1.8,
}
RELOAD_TEXTS = 32  # the split layout scores 8.6M labels in numpy on the CPU: seconds a text


@functools.cache
def scale_data():
    """`scale_data.py` as a module (by its path: this folder must not head sys.path, see above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scale_data", os.path.join(HERE, "scale_data.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["scale_data"] = module  # its writer processes find their task function by module name
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ the probe


class Phases:
    """Wall time and peak GPU memory of nested phases of one process; the peaks of a phase include its children's."""

    def __init__(self):
        import torch

        self.cuda = torch.cuda.is_available()
        self.torch = torch
        if self.cuda and "LOCAL_RANK" in os.environ:  # as the Trainer will: no rank reads (and holds) GPU 0
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        self.stack = [{"name": "process", "started": time.perf_counter(), "allocated": 0, "reserved": 0}]
        self.done = []

    def _flush(self):
        if not self.cuda:
            return
        allocated = self.torch.cuda.max_memory_allocated()
        reserved = self.torch.cuda.max_memory_reserved()
        for phase in self.stack:
            phase["allocated"] = max(phase["allocated"], allocated)
            phase["reserved"] = max(phase["reserved"], reserved)
        self.torch.cuda.reset_peak_memory_stats()

    @contextlib.contextmanager
    def phase(self, name):
        self._flush()
        record = {"name": name, "started": time.perf_counter(), "allocated": 0, "reserved": 0}
        self.stack.append(record)
        try:
            yield record
        finally:
            if self.cuda:
                self.torch.cuda.synchronize()
            self._flush()
            self.stack.remove(record)
            record["ended"] = time.perf_counter()
            record["seconds"] = record["ended"] - record.pop("started")
            record["rss"] = _rss_bytes()
            self.done.append(record)

    def report(self) -> dict:
        self._flush()
        process = self.stack[0]
        return {
            "seconds": time.perf_counter() - process["started"],
            "gpu_allocated": process["allocated"],
            "gpu_reserved": process["reserved"],
            "rss": _rss_bytes(),
            "device": self.torch.cuda.get_device_name() if self.cuda else "cpu",
            "phases": self.done,
        }


def _rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _wrap(owner, name, phases, phase_name):
    original = getattr(owner, name, None)
    if original is None:  # moved or renamed: the phase is not reported
        return

    @functools.wraps(original)
    def timed(*args, **kwargs):
        with phases.phase(phase_name):
            return original(*args, **kwargs)

    setattr(owner, name, timed)


def window_start(step_count: int) -> int:
    """The first step of the measured window: after a fifth of the run's steps, at most 10 (warm-up, kernels)."""
    return min(10, (step_count - 1) // 5)


def _record_steps(trainer_class, steps: list):
    """Times the training steps of this process (a resumed run counts from its first step): the entry time of
    each, the device synchronised where the measured window starts and at the last step."""
    import torch

    original = trainer_class.training_step
    planned = []

    @functools.wraps(original)
    def step(self, *args, **kwargs):
        if not planned:
            planned.append(self.state.max_steps - self.state.global_step)
        if torch.cuda.is_available() and len(steps) in (window_start(planned[0]), planned[0] - 1):
            torch.cuda.synchronize()
        batch = self.args.per_device_train_batch_size * self.args.world_size * self.args.gradient_accumulation_steps
        steps.append((self.state.global_step, time.perf_counter(), batch))
        return original(self, *args, **kwargs)

    trainer_class.training_step = step


def instrument(phases: Phases, steps: list) -> None:
    """Wraps the functions each phase runs in (measurement only: arguments and results pass unchanged), in every
    module that calls them by its own name for them."""
    import haste_hf
    from haste_hf import data, evaluation, export, recipe
    from haste_hf.cli import commands
    from haste_hf.labels import layout

    trainer = haste_hf.HasteTrainer
    for owner, name, phase in (
        (data, "load_xmc_dataset", "read"),
        (recipe, "build_layout", "layout"),
        (layout, "compute_label_embeddings", "label embeddings"),
        (layout, "group_labels", "grouping"),
        (recipe, "build_model", "model"),
        (trainer, "train", "training"),
        (trainer, "_save_checkpoint", "checkpoint"),
        (trainer, "_load_from_checkpoint", "resume load"),
        (recipe, "save_trained", "save"),
        (recipe, "evaluate_split", "test evaluation"),
        (evaluation, "evaluate_split", "test evaluation"),
        (commands, "load_trained", "load model"),
        (evaluation, "predict_top_k", "top-k"),
        (export, "export_onnx", "export"),
    ):
        _wrap(owner, name, phases, phase)
    _record_steps(trainer, steps)


def steady_texts_per_second(steps: list, phases: list) -> float | None:
    """Texts/s over the steps from `window_start`: their texts over the time from the window's first step to its
    last, less the checkpoint saves in between."""
    if len(steps) < 3:
        return None
    start = window_start(len(steps))
    first, last = steps[start], steps[-1]
    texts = sum(batch for _, _, batch in steps[start:-1])
    saving = sum(p["seconds"] for p in phases if p["name"] == "checkpoint" and first[1] <= p.get("ended", 0) <= last[1])
    elapsed = last[1] - first[1] - saving
    return texts / elapsed if elapsed > 0 else None


def run_probe(args) -> int:
    """`scale.py probe --report FILE -- CLI ARGS`: `haste_hf.cli.main(CLI ARGS)` measured; `scale.py probe
    --report FILE --reload ...` the reload check."""
    phases, steps = Phases(), []
    code = 1
    extra = {}
    try:
        if args.reload:
            extra = reload_check(args, phases)
            code = 0
        else:
            from haste_hf.cli import main

            instrument(phases, steps)
            code = main(args.cli)
    finally:
        report = phases.report() | extra
        report["exit"] = code
        report["steps"] = len(steps)
        report["texts_per_second"] = steady_texts_per_second(steps, report["phases"])
        rank = os.environ.get("RANK")
        path = args.report if rank is None else f"{args.report}.rank{rank}"
        Path(path).write_text(json.dumps(report, indent=1))
    return code


def reload_check(args, phases) -> dict:
    """Loads the export (or, without one, the saved folder), predicts the first test texts and counts how
    many top-1 labels agree with `haste-hf predict`'s."""
    import gzip

    texts = []
    with gzip.open(Path(args.data) / "tst.json.gz", "rt", encoding="utf-8") as handle:
        for line in handle:
            texts.append(json.loads(line)["title"])
            if len(texts) == RELOAD_TEXTS:
                break
    with open(args.predictions, encoding="utf-8") as handle:
        expected = [json.loads(line)["label_ids"][0] for _, line in zip(range(len(texts)), handle)]
    if args.export and (Path(args.export) / "haste_onnx.json").is_file():
        from transformers import AutoTokenizer

        from haste_hf import OnnxClassifier

        with phases.phase("load"):
            classifier = OnnxClassifier(args.export)
            tokenizer = AutoTokenizer.from_pretrained(args.export)
        with phases.phase("top-k"):
            batch = tokenizer(texts, truncation=True, padding=True, return_tensors="np")
            top = classifier.top_k(batch["input_ids"], batch["attention_mask"], 1)[0][:, 0].tolist()
        what = "ONNX export"
    else:
        import torch
        from transformers import AutoTokenizer

        from haste_hf import HasteForExtremeClassification

        with phases.phase("load"):
            model = HasteForExtremeClassification.from_pretrained(args.model)
            tokenizer = AutoTokenizer.from_pretrained(args.model)
            model.to("cuda" if torch.cuda.is_available() else "cpu").eval()
        with phases.phase("top-k"), torch.no_grad():
            batch = tokenizer(texts, truncation=True, padding=True, return_tensors="pt").to(model.device)
            top = model.predict_topk(**batch, k=1).label_ids[:, 0].tolist()
        what = "saved folder"
    agree = sum(a == b for a, b in zip(top, expected))
    return {"reloaded": what, "top1_agreement": agree / max(1, len(texts))}


# ------------------------------------------------------------------------------------------------ the encoder


def tiny_encoder(folder: Path) -> str:
    """A 2-layer BERT of width 128 whose WordPiece vocabulary is `scale_data`'s syllables (a word is four pieces):
    CPU runs learn from it what MiniLM would learn from the same words."""
    from transformers import BertConfig, BertModel, BertTokenizer

    syllables = [bytes(pair).decode() for pair in scale_data().SYLLABLES.tolist()]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *syllables, *("##" + s for s in syllables)]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=512,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# ------------------------------------------------------------------------------------------------ the stages


def child(command: list[str], timeout: float, env=None) -> dict:
    """Runs `command`; its wall time, exit status and the peak RSS of its process tree (`wait4`)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, start_new_session=True)
    deadline = started + timeout
    status = rusage = None
    while status is None:
        pid, status_, rusage_ = os.wait4(process.pid, os.WNOHANG)
        if pid:
            status, rusage = status_, rusage_
        elif time.perf_counter() > deadline:
            os.killpg(process.pid, 9)  # its whole session: torchrun's ranks and data-loader workers too
            _, status, rusage = os.wait4(process.pid, 0)
            process.returncode = -9
            break
        else:
            time.sleep(0.2)
    process.returncode = os.waitstatus_to_exitcode(status) if process.returncode is None else process.returncode
    return {"exit": process.returncode, "wall": time.perf_counter() - started, "tree_rss": rusage.ru_maxrss * 1024}


def read_reports(path: Path) -> list[dict]:
    if path.is_file():
        return [json.loads(path.read_text())]
    return [json.loads(p.read_text()) for p in sorted(path.parent.glob(path.name + ".rank*"))]


class Runner:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        self.data = self.work / "data"
        self.layout = self.work / "layout.safetensors"
        self.model = self.work / "model"
        self.export = self.work / "onnx"
        self.predictions = self.work / "predictions.jsonl"
        self.results = {"stages": {}}
        if args.json and Path(args.json).is_file():  # stages of an earlier call on the same work folder stay
            self.results = json.loads(Path(args.json).read_text())
        if args.stages or "args" not in self.results:  # a call that runs no stage only prints the table again
            self.results["args"] = {k: v for k, v in vars(args).items() if k != "func"}

    def probe_command(self, name: str, cli_args: list[str], processes: int = 1) -> list[str]:
        report = self.work / f"report-{name}.json"
        for stale in [report, *report.parent.glob(report.name + ".rank*")]:
            stale.unlink(missing_ok=True)
        launcher = [sys.executable]
        if processes > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
        return [*launcher, os.path.abspath(__file__), "probe", "--report", str(report), "--", *cli_args]

    def run(self, name: str, command: list[str], metrics: Path | None = None) -> dict:
        print(f"[scale] {name}: {' '.join(command)}", flush=True)
        if metrics is not None:
            metrics.unlink(missing_ok=True)
        outcome = child(command, self.args.stage_timeout)
        outcome["reports"] = read_reports(self.work / f"report-{name}.json")
        if metrics is not None and metrics.is_file():
            outcome["metrics"] = json.loads(metrics.read_text())
        self.results["stages"][name] = outcome
        self.save()
        status = "ok" if outcome["exit"] == 0 else f"FAILED (exit {outcome['exit']})"
        print(f"[scale] {name}: {status} in {outcome['wall']:.1f} s", flush=True)
        if outcome["exit"] != 0 and not self.args.keep_going:
            raise SystemExit(f"stage {name} failed; see its output above")
        return outcome

    def save(self):
        if self.args.json:
            Path(self.args.json).write_text(json.dumps(self.results, indent=1))

    def common(self) -> list[str]:
        flags = ["--data", str(self.data)]
        if self.args.max_length:
            flags += ["--max-length", str(self.args.max_length)]
        return flags

    def train_flags(self, steps: int) -> list[str]:
        a = self.args
        flags = ["--encoder", self.encoder, "--layout-file", str(self.layout), "--output-dir", str(self.model)]
        flags += ["--max-steps", str(steps), "--save-strategy", "steps", "--save-steps", str(a.max_steps)]
        flags += ["--logging-steps", str(max(1, a.max_steps // 10)), "--dataloader-num-workers", str(a.workers)]
        if a.batch_size:
            flags += ["--per-device-train-batch-size", str(a.batch_size)]
        if a.eval_batch_size:
            flags += ["--per-device-eval-batch-size", str(a.eval_batch_size)]
        if a.gpus > 1 and not _has_cuda():
            flags += ["--use-cpu", "true"]
        return [*flags, *a.train_flag]

    # -------------------------------------------------------------------------------------------- stages

    def stage_data(self):
        a = self.args
        if self.data.exists():
            shutil.rmtree(self.data)
        command = [sys.executable, os.path.join(HERE, "scale_data.py"), "--preset", a.preset, "--scale", str(a.scale)]
        command += ["--out", str(self.data), "--test-points", str(a.test_points), "--seed", str(a.seed)]
        self.run("data", command)
        self.read_data_stats()

    def read_data_stats(self):
        """The data's statistics into the results (kept there: a later call may find no data folder)."""
        stats_file = self.data / "stats.json"
        if stats_file.is_file():
            self.results["data"] = json.loads(stats_file.read_text())
            self.save()

    def stage_group(self):
        a = self.args
        flags = ["group", *self.common(), "--encoder", self.encoder, "--output", str(self.layout)]
        if a.eval_batch_size:
            flags += ["--per-device-eval-batch-size", str(a.eval_batch_size)]
        self.run("group", self.probe_command("group", [*flags, *a.group_flag]))

    def stage_train(self):
        flags = ["train", *self.common(), *self.train_flags(self.args.max_steps), "--overwrite-output-dir"]
        self.run("train", self.probe_command("train", flags, self.args.gpus), self.model / "test_metrics.json")

    def stage_resume(self):
        steps = self.args.max_steps + self.args.resume_steps
        flags = ["train", *self.common(), *self.train_flags(steps), "--resume-from-checkpoint"]
        self.run("resume", self.probe_command("resume", flags, self.args.gpus), self.model / "test_metrics.json")

    def stage_evaluate(self):
        metrics = self.work / "evaluate.json"
        flags = ["evaluate", "--model", str(self.model), *self.common(), "--output", str(metrics)]
        self.run("evaluate", self.probe_command("evaluate", flags), metrics)

    def stage_predict(self):
        flags = ["predict", "--model", str(self.model), *self.common(), "--output", str(self.predictions), "-k", "5"]
        self.run("predict", self.probe_command("predict", flags))

    def stage_export(self):
        try:
            import onnx  # noqa: F401
            import onnxruntime  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as error:
            self.results["stages"]["export"] = {"skipped": f"no ONNX packages ({error.name})"}
            print(f"[scale] export: skipped, {error.name} is not installed", flush=True)
            return
        flags = ["export", "--model", str(self.model), "--output", str(self.export), "--overwrite"]
        self.run("export", self.probe_command("export", flags))

    def stage_reload(self):
        command = self.probe_command("reload", [])
        command = command[: command.index("--")]
        command += ["--reload", "--model", str(self.model), "--data", str(self.data)]
        command += ["--predictions", str(self.predictions), "--export", str(self.export)]
        self.run("reload", command)

    def main(self):
        a = self.args
        self.work.mkdir(parents=True, exist_ok=True)
        self.encoder = tiny_encoder(self.work / "tiny-encoder") if a.encoder == "tiny" else a.encoder
        if "export" not in a.stages and self.export.exists():
            shutil.rmtree(self.export)  # a reload must not read an export of another model
        for name in STAGES:
            if name in a.stages:
                getattr(self, f"stage_{name}")()
        self.read_data_stats()
        table = markdown(self.results, json.loads(Path(a.compare).read_text()) if a.compare else None)
        print(table)
        if a.out:
            Path(a.out).write_text(table)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ------------------------------------------------------------------------------------------------ the table


def _gib(value) -> str:
    return "-" if not value else f"{value / GIB:.2f}"


def stage_peaks(stage: dict) -> tuple[float, float, float]:
    """(peak GPU allocated, reserved, host RSS) over the stage's processes (the busiest rank)."""
    reports = stage.get("reports") or []
    allocated = max((r["gpu_allocated"] for r in reports), default=0)
    reserved = max((r["gpu_reserved"] for r in reports), default=0)
    return allocated, reserved, stage.get("tree_rss", 0)


def phase_rows(stage: dict) -> list[tuple[str, float, int]]:
    """(phase, seconds summed over its calls, peak GPU allocated) of rank 0, in the order of `TRAIN_PHASES`."""
    reports = stage.get("reports") or []
    if not reports:
        return []
    totals = {}
    for phase in reports[0]["phases"]:
        seconds, peak = totals.get(phase["name"], (0.0, 0))
        totals[phase["name"]] = (seconds + phase["seconds"], max(peak, phase["allocated"]))
    order = [name for name in TRAIN_PHASES if name in totals] + [n for n in totals if n not in TRAIN_PHASES]
    return [(name, *totals[name]) for name in order]


def texts_per_second(stage: dict) -> float | None:
    reports = stage.get("reports") or []
    return reports[0].get("texts_per_second") if reports else None


def metric_note(metrics: dict | None, chance: dict | None) -> str:
    if not metrics:
        return ""
    parts = []
    for k in (1, 3, 5):
        value = metrics.get(f"P@{k}")
        if value is None:
            continue
        text = f"P@{k} {100 * value:.2f}"
        if chance:
            text += f" (top-frequency {100 * chance[f'most frequent P@{k}']:.2f}, random {100 * chance[f'random P@{k}']:.4f})"
        parts.append(text)
    return "; ".join(parts)


def markdown(results: dict, compare: dict | None = None) -> str:
    stages, data = results["stages"], results.get("data") or {}
    args = results["args"]
    devices = {r["device"] for s in stages.values() for r in s.get("reports") or []}
    lines = [
        f"# haste-hf at scale: {args['preset']} x {args['scale']} ({', '.join(sorted(devices)) or '?'}, {args['gpus']} process(es) for train/resume)",
        "",
    ]
    if data:
        lines += [
            f"Data: {data['train_points']:,} train / {data['test_points']:,} test points, {data['labels']:,} labels, "
            f"{data['labels_per_train_point']:.2f} labels per point, {data['points_per_label']:.2f} points per label, "
            f"most frequent label in {100 * data['head_share_of_points']:.1f}% of the points, "
            f"{data['labels_seen_once']:,} labels seen once. Encoder: {args['encoder']}; train steps {args['max_steps']} "
            f"+ {args['resume_steps']} resumed, {args['workers']} data-loader workers; other train flags "
            f"{' '.join(args['train_flag']) or '(defaults)'}.",
            "",
        ]
    lines += [
        "| stage | wall s | peak GPU GiB (allocated / reserved) | peak host RSS GiB | notes |",
        "|---|---|---|---|---|",
    ]
    for name in STAGES:
        stage = stages.get(name)
        if stage is None:
            continue
        if "skipped" in stage:
            lines.append(f"| {name} | - | - | - | skipped: {stage['skipped']} |")
            continue
        allocated, reserved, rss = stage_peaks(stage)
        notes = [] if stage["exit"] == 0 else [f"FAILED (exit {stage['exit']})"]
        speed = texts_per_second(stage)
        if speed:
            notes.append(f"{speed:,.0f} texts/s")
        notes.append(metric_note(stage.get("metrics"), data.get("chance")))
        for report in (stage.get("reports") or [])[:1]:
            if "top1_agreement" in report:
                notes.append(
                    f"{report['reloaded']}: top-1 agrees with predict on {100 * report['top1_agreement']:.1f}%"
                )
        lines.append(
            f"| {name} | {stage['wall']:.1f} | {_gib(allocated)} / {_gib(reserved)} | {_gib(rss)} | {'; '.join(n for n in notes if n)} |"
        )
        for phase, seconds, peak in phase_rows(stage):
            lines.append(f"| &nbsp;&nbsp;{name}: {phase} | {seconds:.1f} | {_gib(peak)} | | |")
    lines += ["", *targets(results, compare)]
    return "\n".join(lines) + "\n"


def targets(results: dict, compare: dict | None) -> list[str]:
    """The issue's targets beside the figures (they apply to the 8.6M preset at scale 1 on an H100)."""
    stages = results["stages"]
    lines = ["| target (8.6M labels, H100, MiniLM, defaults) | goal | measured |", "|---|---|---|"]
    train_peak = max(
        (stage_peaks(stages[n])[0] for n in ("train", "resume") if n in stages and "reports" in stages[n]), default=None
    )
    if train_peak:
        lines.append(
            f"| train: peak GPU (busiest rank) | <= {TARGETS['train peak GPU GiB']:.0f} GiB | {_gib(train_peak)} GiB |"
        )
    if "group" in stages and "wall" in stages["group"]:
        lines.append(
            f"| semantic grouping (`haste-hf group`) | <= {TARGETS['grouping s']:.0f} s | {stages['group']['wall']:.0f} s |"
        )
    checkpoints = [
        s for n in ("train", "resume") for name, s, _ in phase_rows(stages.get(n, {})) if name == "checkpoint"
    ]
    if checkpoints:
        lines.append(f"| checkpoint save | <= {TARGETS['checkpoint s']:.0f} s | {max(checkpoints):.1f} s |")
    if compare and "train" in stages and "train" in compare["stages"]:
        mine, theirs = stages["train"], compare["stages"]["train"]
        ratio = stage_peaks(mine)[0] / max(1, stage_peaks(theirs)[0])
        lines.append(f"| per-rank peak GPU vs the compared run | <= {TARGETS['two GPUs peak ratio']} | {ratio:.2f} |")
        speed, base = texts_per_second(mine), texts_per_second(theirs)
        if speed and base:
            lines.append(f"| texts/s vs the compared run | >= {TARGETS['two GPUs speed-up']}x | {speed / base:.2f}x |")
    return lines


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["probe"]:
        probe = argparse.ArgumentParser(prog="scale.py probe")
        probe.add_argument("--report", required=True)
        probe.add_argument("--reload", action="store_true")
        probe.add_argument("--model")
        probe.add_argument("--data")
        probe.add_argument("--predictions")
        probe.add_argument("--export")
        own, cli = (argv[1:], []) if "--" not in argv else (argv[1 : argv.index("--")], argv[argv.index("--") + 1 :])
        args = probe.parse_args(own)
        args.cli, args.func = cli, run_probe
        return args
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(scale_data().PRESETS), default="lf-paper2keywords-8.6m")
    parser.add_argument("--scale", type=float, default=1.0, help="Shrinks the preset (points and labels).")
    parser.add_argument("--test-points", type=int, default=20_000, help="Test points (a bounded test split).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="/tmp/haste-scale", help="Folder of the data, layout, model and reports.")
    parser.add_argument("--encoder", default="minilm", help="Encoder path or id; 'tiny': a small random BERT (CPU).")
    parser.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"Comma-separated, of {', '.join(STAGES)}; empty: print the table of --json again.",
    )
    parser.add_argument("--gpus", type=int, default=1, help="Processes (torchrun) of train and resume.")
    parser.add_argument(
        "--max-steps", type=int, default=200, help="Training steps; the checkpoint is saved at the last."
    )
    parser.add_argument("--resume-steps", type=int, default=50, help="Steps the resumed run adds.")
    parser.add_argument("--batch-size", type=int, default=None, help="Per device (default: the CLI's).")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="Default: the CLI's.")
    parser.add_argument("--max-length", type=int, default=None, help="Tokens per text (default: the CLI's).")
    parser.add_argument("--workers", type=int, default=4, help="Data-loader workers of training.")
    parser.add_argument("--train-flag", action="append", default=[], help="An extra `train` flag (repeat it).")
    parser.add_argument("--group-flag", action="append", default=[], help="An extra `group` flag (repeat it).")
    parser.add_argument("--stage-timeout", type=float, default=3600.0, help="Seconds before a stage is killed.")
    parser.add_argument("--keep-going", action="store_true", help="Run the next stages after a failed one.")
    parser.add_argument("--compare", default=None, help="JSON of a one-GPU run: the two-GPU targets against it.")
    parser.add_argument(
        "--json", default=None, help="Every figure, in this JSON file (stages already in it and not run now stay)."
    )
    parser.add_argument("--out", default=None, help="Write the markdown table to this file.")
    args = parser.parse_args(argv)
    args.stages = [name.strip() for name in args.stages.split(",") if name.strip()]
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {', '.join(STAGES)}")
    args.train_flag = [token for flag in args.train_flag for token in flag.split()]
    args.group_flag = [token for flag in args.group_flag for token in flag.split()]
    args.func = lambda parsed: Runner(parsed).main()
    return args


def main(argv=None):
    args = parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
