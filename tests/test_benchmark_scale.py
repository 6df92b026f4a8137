# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""benchmarks/scale_data.py (datasets of the paper's label statistics) and benchmarks/scale.py (every `haste-hf`
stage on them), at tiny sizes on the CPU."""

import gzip
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the writer processes find their task function by module name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def scale_data():
    return load_script("scale_data")


@pytest.fixture(scope="module")
def small_set(scale_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("scale-data")
    stats = scale_data.generate(folder, "amazon-670k", scale=0.003, test_points=300, seed=3, processes=1)
    return folder, stats


def read_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_presets_are_the_papers_table(scale_data):
    sizes = scale_data.scaled(scale_data.PRESETS["lf-paper2keywords-8.6m"], 1.0, None)
    assert sizes == dict(
        labels=8_623_847, trained_labels=8_623_847, train_points=2_020_621, test_points=2_020_621,
        train_positives=18_246_208,
    )  # fmt: skip
    assert scale_data.scaled(scale_data.PRESETS["amazon-3m"], 0.5, 100)["labels"] == 1_406_140
    counts = scale_data.label_counts(10_000, 40_000, 7_000, exponent=0.7)
    assert counts.sum() == 40_000 and counts.min() >= 1 and counts.max() <= 7_000
    assert np.all(np.diff(counts) <= 0)  # by rank, descending: a power-law head


def test_generated_set_reads_and_has_the_statistics(small_set):
    from haste_hf.data import load_xmc_dataset

    folder, stats = small_set
    data = load_xmc_dataset(folder, text_fields="title_content", cache_dir=folder / "cache")
    assert data.label_count == stats["labels"] == 2010
    assert data.num_train_points == stats["train_points"] == 1471
    assert len(data.splits["test"]) == 300
    assert data.train_label_frequencies.min() >= 1  # every label has a training point
    assert data.train_label_frequencies.max() == stats["max_label_count"]
    assert stats["labels_per_train_point"] == pytest.approx(5.45, rel=0.01)
    assert stats["points_per_label"] == pytest.approx(1471 * 5.45 / 2010, rel=0.01)
    assert len(data.label_texts) == 2010 and all(len(text.split()) == 3 for text in data.label_texts)
    # Chance: a random label is right 1 time in L per true label; the most frequent labels far more often.
    assert stats["chance"]["random P@1"] == pytest.approx(stats["labels_per_test_point"] / 2010)
    assert stats["chance"]["most frequent P@1"] > 20 * stats["chance"]["random P@1"]


def test_texts_carry_their_labels_words(small_set):
    """The labels are learnable from the texts: looking a title's words up among the label texts finds the
    point's labels (P@1 of the lookup on the test split near 1, chance is 1 in 2,010)."""
    folder, _ = small_set
    owner = {}
    for label, record in enumerate(read_lines(folder / "lbl.json.gz")):
        for word in record["title"].split():
            owner.setdefault(word, set()).add(label)
    points = read_lines(folder / "tst.json.gz")
    hits = 0
    for point in points:
        found = [label for word in point["title"].split() for label in sorted(owner.get(word, ()))]
        hits += bool(found) and found[0] in point["target_ind"]
        every_label_named = {label for word in point["title"].split() for label in owner.get(word, ())}
        assert set(point["target_ind"]) <= every_label_named  # each label has a word in the title
    assert hits / len(points) > 0.95


def test_files_do_not_depend_on_the_process_count(scale_data, small_set, tmp_path):
    folder, _ = small_set
    scale_data.generate(tmp_path, "amazon-670k", scale=0.003, test_points=300, seed=3, processes=2)
    for name in ("trn.json.gz", "tst.json.gz", "lbl.json.gz"):
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes(), name
    other = tmp_path / "other-seed"
    scale_data.generate(other, "amazon-670k", scale=0.003, test_points=300, seed=4, processes=1)
    assert (other / "trn.json.gz").read_bytes() != (folder / "trn.json.gz").read_bytes()


@pytest.mark.parametrize("preset, labels", [("synthetic-100m", 100_000_000), ("synthetic-1b", 1_000_000_000)])
def test_the_largest_presets_train_100m_labels_on_the_same_points(scale_data, preset, labels):
    """Both train 100M labels on 4M points and 110M positives: the 1B preset's other labels have an id and a text
    only, so it needs no more positives than the 100M one; scaled down, the trained labels shrink alike."""
    sizes = scale_data.scaled(scale_data.PRESETS[preset], 1.0, 1000)
    assert sizes == dict(
        labels=labels, trained_labels=100_000_000, train_points=4_000_000, test_points=1000,
        train_positives=110_000_000,
    )  # fmt: skip
    assert scale_data.scaled(scale_data.PRESETS[preset], 1e-5, 10)["trained_labels"] == 1000


def test_the_100m_preset_has_every_label_in_few_points(scale_data):
    counts = scale_data.label_counts(10_000, 11_000, 400, exponent=0.7)  # the preset at 10^-4
    assert counts.min() == 1 and counts.sum() == 11_000 and counts[0] > 10  # every label seen, a power-law head


def test_labels_with_no_training_point_are_in_the_label_space_only(scale_data, tmp_path, monkeypatch):
    """A preset's `trained_labels`: the others have a label text and an id, and no training or test point."""
    from haste_hf.data import load_xmc_dataset

    monkeypatch.setitem(scale_data.PRESETS, "few-trained", scale_data.Preset(400, 100, 5000, 3.0, 0.24, 600))
    stats = scale_data.generate(tmp_path, "few-trained", test_points=100, seed=1, processes=1)
    data = load_xmc_dataset(tmp_path, text_fields="title_content", cache_dir=tmp_path / "cache")
    assert data.label_count == stats["labels"] == 5000 and len(data.label_texts) == 5000
    frequencies = data.train_label_frequencies
    assert (frequencies > 0).sum() == 600 == 5000 - stats["labels_without_training_point"]
    assert stats["train_positives"] == frequencies.sum() == pytest.approx(1200, rel=0.02)
    test_labels = {label for point in read_lines(tmp_path / "tst.json.gz") for label in point["target_ind"]}
    assert test_labels and all(frequencies[label] > 0 for label in test_labels)


def test_quality_baselines_score_as_the_generator_counts_them(small_set):
    """scale_quality.py's most-frequent predictor is the generator's chance level; random labels are near 0."""
    quality = load_script("scale_quality")
    folder, stats = small_set
    chance = quality.baselines(folder, "amazon-670k", seed=0)
    for k in (1, 3, 5):
        assert chance["most frequent labels"][f"P@{k}"] == pytest.approx(stats["chance"][f"most frequent P@{k}"])
        assert chance["random labels"][f"P@{k}"] < 0.05
    assert 0 < chance["most frequent labels"]["PSP@1"] < chance["most frequent labels"]["P@1"]


def test_several_gpus_are_judged_against_their_own_targets():
    table = load_script("scale_table")
    report = {"gpu_allocated": 4 * 2**30, "gpu_reserved": 0, "phases": [], "texts_per_second": 3800.0, "device": "GPU"}
    run = {"stages": {"train": {"exit": 0, "wall": 1.0, "reports": [report, dict(report, gpu_allocated=2**30)]}}}
    base = {"stages": {"train": {"exit": 0, "wall": 1.0, "reports": [dict(report, gpu_allocated=8 * 2**30)]}}}
    base["stages"]["train"]["reports"][0]["texts_per_second"] = 1000.0
    for gpus, goal in ((2, ">= 1.9x"), (4, ">= 3.7x"), (8, "(reported)")):
        run["args"] = {"gpus": gpus, "preset": "lf-paper2keywords-8.6m"}
        lines = table.targets(run, base)
        assert f"| texts/s vs one GPU ({gpus} GPUs) | {goal} | 3.80x |" in lines
        peak = "<= 0.6" if gpus == 2 else "(reported)"
        assert f"| busiest rank's peak GPU vs one GPU's ({gpus} GPUs) | {peak} | 0.50 |" in lines
        assert "| train: peak GPU (busiest rank) | <= 10 GiB | 4.00 GiB |" in lines
    run["args"]["preset"] = "synthetic-100m"
    assert "| train: peak GPU (busiest rank) | <= 40 GiB | 4.00 GiB |" in table.targets(run, base)


def test_steady_texts_per_second_leaves_out_the_first_steps_and_the_saves():
    scale = load_script("scale")
    steps = [(index, float(index), 8) for index in range(11)]  # one step a second, 8 texts each
    steps[6:] = [(index, time + 5.0, 8) for index, time, _ in steps[6:]]  # a 5 s checkpoint after step 5
    phases = [{"name": "checkpoint", "seconds": 5.0, "ended": 10.5}]
    # Measured from step 2 (a fifth of 10) to step 10: 8 steps of 8 texts in 13 s, less the 5 s save.
    assert scale.steady_texts_per_second(steps, phases) == pytest.approx(64 / 8)


def test_a_phases_host_rss_is_its_own_sampled_peak():
    """A phase's RSS row is the peak sampled while it ran (`rss_peak`), not the process's peak so far at its end
    (which would charge every later phase with the read's memory); reports without samples keep the latter."""
    table = load_script("scale_table")
    phases = [
        {"name": "read", "seconds": 1.0, "allocated": 0, "rss": 5 * 2**30, "rss_peak": 5 * 2**30},
        {"name": "model", "seconds": 2.0, "allocated": 0, "rss": 5 * 2**30, "rss_peak": 2**30},
        {"name": "save", "seconds": 1.0, "allocated": 0, "rss": 3 * 2**30},
    ]
    rows = table.phase_rows({"reports": [{"phases": phases}]})
    assert [(name, rss) for name, _, _, rss in rows] == [("read", 5 * 2**30), ("model", 2**30), ("save", 3 * 2**30)]
    assert load_script("scale")._current_rss_bytes() > 2**20  # this process's resident memory now


def test_the_label_text_init_is_a_phase_of_its_own_timed_once_on_a_rank(monkeypatch):
    """The train stage's label-text init is its own row ("label texts", after "model"), timed once where a rank's
    share of it runs the whole one's code (`init_share_from_label_texts_` calls `init_from_label_texts_`)."""
    from haste_hf.labels import text_init

    scale, table = load_script("scale"), load_script("scale_table")
    wrapped = []
    monkeypatch.setattr(scale, "_wrap", lambda owner, name, phases, phase: wrapped.append((owner, name, phase)))
    monkeypatch.setattr(scale, "_record_steps", lambda trainer, steps: None)
    scale.instrument(None, [])
    assert {(name, phase) for owner, name, phase in wrapped if owner is text_init} == {
        ("init_from_label_texts_", "label texts"),
        ("init_share_from_label_texts_", "label texts"),
    }
    assert table.TRAIN_PHASES.index("label texts") == table.TRAIN_PHASES.index("model") + 1
    monkeypatch.undo()

    phases = scale.Phases()
    monkeypatch.setattr(text_init, "init_from_label_texts_", lambda: time.sleep(0.01) or 3)
    monkeypatch.setattr(text_init, "init_share_from_label_texts_", lambda: text_init.init_from_label_texts_())
    for name in ("init_from_label_texts_", "init_share_from_label_texts_"):
        scale._wrap(text_init, name, phases, "label texts")
    assert text_init.init_share_from_label_texts_() == 3 and text_init.init_from_label_texts_() == 3
    assert [phase["name"] for phase in phases.report()["phases"]] == ["label texts", "label texts"]  # not 3


def test_a_stage_cut_by_the_calls_budget_is_reported_stopped_not_failed(tmp_path, monkeypatch):
    """A stage that the call's budget (`--budget-s`) or `--stage-timeout` kills is a stopped stage in the log and the
    table ("stopped at ..., unfinished"), not a "FAILED (exit -9)" one; a stage that fails by itself still FAILs."""
    scale, table = load_script("scale"), load_script("scale_table")
    monkeypatch.setattr(scale, "MIN_STAGE_SECONDS", 0)
    argv = ["--preset", "amazon-670k", "--work", str(tmp_path), "--keep-going", "--budget-s", "1", "--stages", "data"]
    runner = scale.Runner(scale.parse_args(argv))
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    stopped = runner.run("add-labels", sleeper, ran="1,000 labels from their texts")
    assert stopped["exit"] == -9 and stopped["wall"] < 30
    assert stopped["stopped"].startswith("stopped at the call's budget (--budget-s) after ")
    runner.deadline, runner.args.stage_timeout = float("inf"), 0.5
    assert runner.run("export", sleeper)["stopped"] == "stopped at --stage-timeout (0 s), unfinished"
    failed = runner.run("reload", [sys.executable, "-c", "raise SystemExit(3)"])
    assert failed["exit"] == 3 and "stopped" not in failed
    runner.results["data"] = {}
    text = table.markdown(runner.results)
    row = next(line for line in text.splitlines() if line.startswith("| add-labels |"))
    assert "1,000 labels from their texts" in row and "stopped at the call's budget" in row and "FAILED" not in row
    assert "FAILED (exit 3)" in next(line for line in text.splitlines() if line.startswith("| reload |"))


def test_train_groups_the_labels_itself_where_asked_and_its_row_says_so(tmp_path):
    """`--group-in-train` (the 10^8-label call): train takes the group flags and no layout file, so the data is read
    once, not by `group` and again by `train`; its row names the grouping and where it ran."""
    scale = load_script("scale")
    argv = [
        "--preset",
        "synthetic-100m",
        "--work",
        str(tmp_path),
        "--stages",
        "train",
        "--group-flag",
        "--grouping random",
    ]
    runner = scale.Runner(scale.parse_args([*argv, "--group-in-train"]))
    runner.encoder = "minilm"  # what `main` sets
    flags = runner.train_flags(30)
    assert "--layout-file" not in flags and flags[flags.index("--grouping") + 1] == "random"
    assert runner.training_run(30).endswith("30 steps, grouping random (in train)")
    apart = scale.Runner(scale.parse_args(argv))
    apart.encoder = "minilm"
    assert "--layout-file" in apart.train_flags(30) and "--grouping" not in apart.train_flags(30)


@pytest.mark.slow
def test_every_stage_runs_on_the_cpu(tmp_path):
    """scale.py end to end at a tiny size (the tiny syllable encoder): data, group, train with a checkpoint,
    resume, evaluate, predict, ONNX export, reload, add-labels; every stage measured, and the table written with
    what each stage ran."""
    pytest.importorskip("onnxruntime")
    results, table = tmp_path / "results.json", tmp_path / "table.md"
    command = [
        sys.executable,
        str(BENCHMARKS / "scale.py"),
        *("--preset", "amazon-670k", "--scale", "0.002", "--test-points", "100", "--work", str(tmp_path / "work")),
        *("--encoder", "tiny", "--max-steps", "4", "--resume-steps", "2", "--batch-size", "16", "--max-length", "32"),
        *("--eval-batch-size", "64", "--workers", "0", "--json", str(results), "--out", str(table)),
        *("--group-flag", "--beta 2"),  # buckets of 2 groups: the clustering runs at this size
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["HF_DATASETS_CACHE"] = str(tmp_path / "datasets-cache")
    process = subprocess.Popen(
        command,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # the stages run in the same session
            process.wait()
    assert process.returncode == 0, output[-4000:]
    figures = json.loads(results.read_text())
    stages = figures["stages"]
    assert list(stages) == ["data", "group", "train", "resume", "evaluate", "predict", "export", "reload", "add-labels"]
    group_phases = {phase["name"] for phase in stages["group"]["reports"][0]["phases"]}
    assert {"read", "label counts", "label embeddings", "clustering", "greedy groups"} <= group_phases
    assert stages["group"]["ran"].startswith("CPU, grouping semantic; commit ")
    assert stages["train"]["ran"].startswith("CPU, 4 steps, grouping semantic (layout file); commit ")
    assert {"add labels", "save folder"} <= {phase["name"] for phase in stages["add-labels"]["reports"][0]["phases"]}
    assert all(stage["exit"] == 0 and stage["wall"] > 0 and stage["tree_rss"] > 0 for stage in stages.values())
    train_phases = {phase["name"] for phase in stages["train"]["reports"][0]["phases"]}
    assert {"read", "layout", "model", "training", "checkpoint", "save", "test evaluation"} <= train_phases
    assert "resume load" in {phase["name"] for phase in stages["resume"]["reports"][0]["phases"]}
    assert stages["train"]["reports"][0]["steps"] == 4 and stages["train"]["reports"][0]["texts_per_second"] > 0
    assert stages["evaluate"]["metrics"] == stages["resume"]["metrics"]  # the saved model scores as train did
    assert stages["reload"]["reports"][0]["top1_agreement"] == 1.0
    text = table.read_text()
    assert "FAILED" not in text and "peak GPU" in text and "| checkpoint save | <= 60 s |" in text
    assert "| grouping (`haste-hf group`, CPU, grouping semantic; commit " in text and "Commit: " in text
    assert "| evaluate: texts/s | >= 5,000 |" in text and "| every stage: peak host RSS | <= 16 GiB |" in text
    assert f"{figures['data']['labels']:,} labels" in text
