# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The product at scale: `haste-hf` itself on a synthetic dataset of the paper's label statistics
(`scale_data.py`), every stage in one run, each stage a child process.

Stages: `data` (write the dataset), `group` (`haste-hf group`: label counts, embeddings, clustering, greedy
groups), `train` (`haste-hf train --layout-file ... --max-steps N`: read, layout check, model, label texts (the output
layer started from the labels' texts), training, a
checkpoint, the final save, the test evaluation), `resume` (`--resume-from-checkpoint`, more steps), `evaluate`,
`predict` (top 5 of the test split to a file), `export` (ONNX), `reload` (the export served by `OnnxClassifier`,
or the saved folder by `from_pretrained`, its top-1 checked against `predict`'s) and `add-labels` (`NEW_LABELS`
labels from their texts). Each command runs under a probe (`scale.py probe`) that times its phases and reads, per
phase and process, the peak GPU memory (`torch.cuda.max_memory_allocated` / `max_memory_reserved`) and the peak
host RSS (`ru_maxrss`); the stage's peak RSS over its process tree comes from `wait4`. `--gpus 2` runs `train` and
`resume` under torchrun (the output layer sharded by labels, the CLI's default with several processes).

    python benchmarks/scale.py --preset lf-paper2keywords-8.6m --encoder /tmp/minilm --out results/scale.md
    python benchmarks/scale.py --preset amazon-670k --scale 0.02 --encoder tiny --stages data,group,train

The table (`scale_table.py`) gives per stage what ran (grouping, GPUs, steps, the commit), the wall time, the
peak GPU memory of the busiest process, the peak host RSS and what the stage yields (texts/s, P@k against chance:
k random labels, and the k most frequent training labels for every text), then the issues' targets beside the
figures (`scale_table.TARGETS`; with `--compare`, the JSON of a one-GPU run, the two-GPU ones). Memory of
data-loader workers is not in the GPU figures (they hold none) but is in the RSS.
"""

import argparse
import contextlib
import functools
import json
import math
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

NEW_LABELS = 1000  # the add-labels stage: new labels from their texts alone
MIN_STAGE_SECONDS = 10  # a stage is not started with less of --budget-s left
RSS_SAMPLE_SECONDS = 0.05  # how often a phase's host RSS is sampled
RELOAD_TEXTS = 32  # the split layout scores 8.6M labels in numpy on the CPU: seconds a text


@functools.cache
def sibling(name: str):
    """The script `name`.py of this folder as a module, by its path (this folder must not head sys.path, see above):
    `scale_data` (the generator), `scale_table` (the table), `provenance` (the commit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # scale_data's writer processes find their task function by module name
    spec.loader.exec_module(module)
    return module


scale_data, scale_table, provenance = (
    functools.partial(sibling, name) for name in ("scale_data", "scale_table", "provenance")
)


# ------------------------------------------------------------------------------------------------ the probe


class Phases:
    """Wall time, peak GPU memory and peak host RSS of nested phases of one process; the peaks of a phase include
    its children's. The RSS of a phase is its own peak (`RSS_SAMPLE_SECONDS` samples of /proc/self/statm), where
    `ru_maxrss` at its end (`rss`) is the process's peak so far."""

    def __init__(self):
        import threading

        import torch

        self.cuda = torch.cuda.is_available()
        self.torch = torch
        if self.cuda and "LOCAL_RANK" in os.environ:  # as the Trainer will: no rank reads (and holds) GPU 0
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        self.stack = [{"name": "process", "started": time.perf_counter(), "allocated": 0, "reserved": 0, "rss_peak": 0}]
        self.done = []
        threading.Thread(target=self._sample_rss, daemon=True).start()

    def _sample_rss(self):
        while True:
            rss = _current_rss_bytes()
            for phase in list(self.stack):
                phase["rss_peak"] = max(phase.get("rss_peak", 0), rss)
            time.sleep(RSS_SAMPLE_SECONDS)

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
        record["rss_peak"] = _current_rss_bytes()
        self.stack.append(record)
        try:
            yield record
        finally:
            if self.cuda:
                self.torch.cuda.synchronize()
            self._flush()
            self.stack.remove(record)
            record["rss_peak"] = max(record["rss_peak"], _current_rss_bytes())
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


def _current_rss_bytes() -> int:
    with open("/proc/self/statm") as handle:  # Linux, as `_rss_bytes`' KiB are
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _wrap(owner, name, phases, phase_name):
    original = getattr(owner, name, None)
    if original is None:  # moved or renamed: the phase is not reported
        return

    @functools.wraps(original)
    def timed(*args, **kwargs):
        if any(phase["name"] == phase_name for phase in phases.stack):  # within itself (a rank's share of the
            return original(*args, **kwargs)  # label-text init runs the whole one's code): timed once
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
    from haste_hf.labels import grouping, layout, text_init
    from haste_hf.modeling import saving

    trainer = haste_hf.HasteTrainer
    for owner, name, phase in (
        (data, "load_xmc_dataset", "read"),
        (recipe, "build_layout", "layout"),
        (layout, "count_labels", "label counts"),
        (layout, "compute_label_embeddings", "label embeddings"),
        (layout, "group_labels", "grouping"),
        (grouping, "_spherical_kmeans", "clustering"),
        (grouping, "_split_large_buckets", "clustering"),
        (grouping, "_greedy_groups", "greedy groups"),
        (recipe, "build_model", "model"),
        (text_init, "init_from_label_texts_", "label texts"),
        (text_init, "init_share_from_label_texts_", "label texts"),
        (trainer, "train", "training"),
        (trainer, "_save_checkpoint", "checkpoint"),
        (trainer, "_load_from_checkpoint", "resume load"),
        (recipe, "save_trained", "save"),
        (recipe, "evaluate_split", "test evaluation"),
        (evaluation, "evaluate_split", "test evaluation"),
        (commands, "load_trained", "load model"),
        (evaluation, "predict_top_k", "top-k"),
        (export, "export_onnx", "export"),
        (haste_hf.HasteForExtremeClassification, "add_labels", "add labels"),
        (saving, "save_trained_folder", "save folder"),
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


# ------------------------------------------------------------------------------------------------ the stages


def child(command: list[str], timeout: float, env=None) -> dict:
    """Runs `command`; its wall time, exit status and the peak RSS of its process tree (`wait4`); `timed_out` when
    it was killed at `timeout` (its exit status is then -9)."""
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
    timed_out = process.returncode is not None
    process.returncode = os.waitstatus_to_exitcode(status) if process.returncode is None else process.returncode
    outcome = {"exit": process.returncode, "wall": time.perf_counter() - started, "tree_rss": rusage.ru_maxrss * 1024}
    return {**outcome, "timed_out": True} if timed_out else outcome


def stopped_note(timeout: float, budget_left: float, stage_timeout: float) -> str:
    """What cut a stage that `child` killed at `timeout`: the call's budget (`--budget-s`), or `--stage-timeout`."""
    if budget_left <= stage_timeout:
        return f"stopped at the call's budget (--budget-s) after {timeout:.0f} s, unfinished"
    return f"stopped at --stage-timeout ({stage_timeout:.0f} s), unfinished"


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
        self.new_labels = self.work / "new_labels.json"
        self.deadline = time.perf_counter() + (args.budget_s or math.inf)
        self.added = self.work / "model-added"
        self.results = {"stages": {}}
        if args.json and Path(args.json).is_file():  # stages of an earlier call on the same work folder stay
            self.results = json.loads(Path(args.json).read_text())
        if args.stages or "args" not in self.results:  # a call that runs no stage only prints the table again
            self.results["args"] = {k: v for k, v in vars(args).items() if k != "func"}
            self.results["commit"] = provenance().tree_commit()

    def probe_command(self, name: str, cli_args: list[str], processes: int = 1) -> list[str]:
        report = self.work / f"report-{name}.json"
        for stale in [report, *report.parent.glob(report.name + ".rank*")]:
            stale.unlink(missing_ok=True)
        launcher = [sys.executable]
        if processes > 1:
            launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
        return [*launcher, os.path.abspath(__file__), "probe", "--report", str(report), "--", *cli_args]

    def run(self, name: str, command: list[str], metrics: Path | None = None, ran="") -> dict:
        """Runs stage `name`; `ran` says what ran (grouping, GPUs, steps, texts), commit added, in its table row."""
        left = self.deadline - time.perf_counter()
        if left < MIN_STAGE_SECONDS:
            self.results["stages"][name] = {"skipped": f"not started: {max(0, left):.0f} s of --budget-s left"}
            print(f"[scale] {name}: skipped, {max(0, left):.0f} s of the budget left", flush=True)
            return self.results["stages"][name]
        print(f"[scale] {name}: {' '.join(command)}", flush=True)
        if metrics is not None:
            metrics.unlink(missing_ok=True)
        outcome = child(command, min(self.args.stage_timeout, left))
        if outcome.pop("timed_out", False):
            outcome["stopped"] = stopped_note(min(self.args.stage_timeout, left), left, self.args.stage_timeout)
        ran = ran() if callable(ran) else ran  # read once the stage is done (the layout's grouping)
        outcome["ran"] = "; ".join(part for part in (ran, f"commit {self.results['commit']}") if part)
        outcome["reports"] = read_reports(self.work / f"report-{name}.json")
        if metrics is not None and metrics.is_file():
            outcome["metrics"] = json.loads(metrics.read_text())
        self.results["stages"][name] = outcome
        self.save()
        status = "ok" if outcome["exit"] == 0 else outcome.get("stopped") or f"FAILED (exit {outcome['exit']})"
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
        # --group-in-train: train groups the labels itself (the group flags its own), the data read once, not twice.
        layout = [*a.group_flag] if a.group_in_train else ["--layout-file", str(self.layout)]
        flags = ["--encoder", self.encoder, *layout, "--output-dir", str(self.model)]
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
        flags += ["--per-device-eval-batch-size", str(a.eval_batch_size)] if a.eval_batch_size else []
        self.layout.unlink(missing_ok=True)  # the row names the grouping of the layout this stage writes
        command = self.probe_command("group", [*flags, *a.group_flag])
        self.run("group", command, ran=lambda: f"{one_device()}, grouping {self.grouping()}")

    def grouping(self) -> str:
        """The layout file's grouping strategy (what `group` wrote); with --group-in-train, what train was told."""
        if self.args.group_in_train:
            flags = self.args.group_flag
            return f"{flags[flags.index('--grouping') + 1] if '--grouping' in flags else 'semantic'} (in train)"
        if not self.layout.is_file():
            return "? (no layout file)"
        from safetensors import safe_open

        with safe_open(str(self.layout), framework="np") as handle:
            return (handle.metadata() or {}).get("strategy", "?")

    def training_run(self, steps: int) -> str:
        gpus = f"{self.args.gpus} processes (torchrun, output layer sharded)" if self.args.gpus > 1 else one_device()
        return f"{gpus}, {steps} steps, grouping {self.grouping()}" + (
            "" if self.args.group_in_train else " (layout file)"
        )

    def test_texts(self, processes: int = 1) -> str:
        where = f"{processes} processes (torchrun, output layer sharded)" if processes > 1 else one_device()
        return f"{where}, {self.results.get('data', {}).get('test_points', 0):,} test texts"

    def stage_train(self):
        flags = ["train", *self.common(), *self.train_flags(self.args.max_steps), "--overwrite-output-dir"]
        command = self.probe_command("train", flags, self.args.gpus)
        self.run("train", command, self.model / "test_metrics.json", ran=self.training_run(self.args.max_steps))

    def stage_resume(self):
        steps = self.args.max_steps + self.args.resume_steps
        flags = ["train", *self.common(), *self.train_flags(steps), "--resume-from-checkpoint"]
        ran = f"{self.training_run(steps)}, from the checkpoint of step {self.args.max_steps}"
        self.run(
            "resume", self.probe_command("resume", flags, self.args.gpus), self.model / "test_metrics.json", ran=ran
        )

    def stage_evaluate(self):
        metrics = self.work / "evaluate.json"
        flags = ["evaluate", "--model", str(self.model), *self.common(), "--output", str(metrics)]
        self.run("evaluate", self.probe_command("evaluate", flags), metrics, ran=self.test_texts())

    def stage_predict(self):
        """On the processes of train: each holds and scores its share of the labels (the folder's rows it owns), as
        no one GPU holds the output layer of 10^9 labels."""
        flags = ["predict", "--model", str(self.model), *self.common(), "--output", str(self.predictions), "-k", "5"]
        ran = f"{self.test_texts(self.args.gpus)}, top 5 to a file"
        self.run("predict", self.probe_command("predict", flags, self.args.gpus), ran=ran)

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
        self.run("export", self.probe_command("export", flags), ran="ONNX, CPU")

    def stage_reload(self):
        command = self.probe_command("reload", [])
        command = command[: command.index("--")]
        command += ["--reload", "--model", str(self.model), "--data", str(self.data)]
        command += ["--predictions", str(self.predictions), "--export", str(self.export)]
        self.run("reload", command, ran=f"{RELOAD_TEXTS} test texts")

    def stage_add_labels(self):
        """`haste-hf add-labels` of `NEW_LABELS` labels from their texts alone (words of `scale_data`'s syllables
        that no label owns: a fifth syllable), into a copy of the trained model."""
        syllables = [bytes(pair).decode() for pair in scale_data().SYLLABLES.tolist()]
        word = lambda i, w: "".join(syllables[(7 * i + 13 * w + 31 * s) % len(syllables)] for s in range(5))  # noqa: E731
        entries = [{"name": f"new-{i}", "text": " ".join(word(i, w) for w in range(3))} for i in range(NEW_LABELS)]
        self.new_labels.write_text(json.dumps(entries))
        flags = ["add-labels", "--model", str(self.model), "--labels", str(self.new_labels), "--output-dir"]
        flags += [str(self.added), "--overwrite-output-dir"]
        self.run("add-labels", self.probe_command("add-labels", flags), ran=f"{NEW_LABELS:,} labels from their texts")

    def main(self):
        a = self.args
        self.work.mkdir(parents=True, exist_ok=True)
        self.encoder = scale_data().tiny_encoder(self.work / "tiny-encoder") if a.encoder == "tiny" else a.encoder
        if "export" not in a.stages and self.export.exists():
            shutil.rmtree(self.export)  # a reload must not read an export of another model
        for name in scale_table().STAGES:
            if name in a.stages:
                getattr(self, f"stage_{name.replace('-', '_')}")()
        self.read_data_stats()
        table = scale_table().markdown(self.results, json.loads(Path(a.compare).read_text()) if a.compare else None)
        print(table)
        if a.out:
            Path(a.out).write_text(table)


@functools.cache
def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def one_device() -> str:
    return "1 GPU" if _has_cuda() else "CPU"


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
        default=",".join(scale_table().STAGES),
        help=f"Comma-separated, of {', '.join(scale_table().STAGES)}; empty: print the table of --json again.",
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
    parser.add_argument(
        "--group-in-train",
        action="store_true",
        help="Train groups the labels itself, with the group flags (no layout file): the data is read once.",
    )
    parser.add_argument("--stage-timeout", type=float, default=3600.0, help="Seconds before a stage is killed.")
    parser.add_argument("--keep-going", action="store_true", help="Run the next stages after a failed one.")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="Seconds for all stages: the last is cut there, later ones skipped.",
    )
    parser.add_argument("--compare", default=None, help="JSON of a one-GPU run: the two-GPU targets against it.")
    parser.add_argument(
        "--json", default=None, help="Every figure, in this JSON file (stages already in it and not run now stay)."
    )
    parser.add_argument("--out", default=None, help="Write the markdown table to this file.")
    args = parser.parse_args(argv)
    args.stages = [name.strip() for name in args.stages.split(",") if name.strip()]
    unknown = sorted(set(args.stages) - set(scale_table().STAGES))
    if unknown:
        parser.error(f"--stages: unknown {unknown}; choose from {', '.join(scale_table().STAGES)}")
    args.train_flag = [token for flag in args.train_flag for token in flag.split()]
    args.group_flag = [token for flag in args.group_flag for token in flag.split()]
    args.func = lambda parsed: Runner(parsed).main()
    return args


def main(argv=None):
    args = parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
