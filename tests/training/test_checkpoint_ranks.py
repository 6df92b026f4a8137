"""Sharded checkpoints on two processes (gloo, CPU) that cannot deadlock, whichever ranks the installed
transformers calls `_save` on; one printed result per run; no process outlives a hung run."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
from launch import TESTS, assert_momentum_in_shards, cli_train_arguments, torchrun, whole_state


def is_running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (a killed process its parent has not reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status


def test_a_hung_run_is_ended_with_all_its_processes(tmp_path):
    """Rank 0 waits in a barrier rank 1 never enters: the timeout kills torchrun and both workers."""
    with pytest.raises((AssertionError, subprocess.TimeoutExpired)):
        torchrun([str(TESTS / "distributed_hang.py"), str(tmp_path)], tmp_path, timeout=60)
    pids = [int((tmp_path / f"pid-{rank}").read_text()) for rank in range(2)]
    deadline = time.monotonic() + 10
    while any(map(is_running, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [pid for pid in pids if is_running(pid)]
    for pid in alive:  # left by a broken helper: not by this test
        os.kill(pid, 9)
    assert not alive, f"workers {alive} outlived their run"


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["main_only", "every_rank"])
def test_sharded_run_checkpoints_saves_and_resumes_whichever_ranks_save(tmp_path, pattern):
    """transformers 5.17 calls `_save` on the main process only, 5.24 on every rank: with either, a sharded run
    checkpoints, saves its model (each rank its rows of the output layer, with their momentum in a checkpoint) and
    resumes to the uninterrupted run's weights."""
    from haste_hf import HasteForExtremeClassification

    # Two runs of 8 steps and a resumption on 2 ranks: 139 s with the 2 cores shared by two `yes` loops and other
    # test runs (load ~12), where 300 s was cut short in the audit; 600 s leaves 4x that.
    torchrun([str(TESTS / "distributed_save_ranks.py"), str(tmp_path), pattern], tmp_path, timeout=600)
    results = torch.load(tmp_path / "results.pt", weights_only=False)
    for folder in (tmp_path / "model", tmp_path / "run" / "checkpoint-8"):
        saved = HasteForExtremeClassification.from_pretrained(folder).state_dict()
        assert set(saved) == set(results["uninterrupted"])
        for name, value in results["uninterrupted"].items():
            assert torch.equal(saved[name], value), (folder, name)
    assert_momentum_in_shards(tmp_path / "run" / "checkpoint-4")
    for name, value in results["uninterrupted"].items():
        assert torch.equal(results["resumed"][name], value), name


@pytest.mark.slow
def test_cli_run_on_two_processes_checkpoints_resumes_and_prints_once(tmp_path):
    """`torchrun -m haste_hf.cli train` with checkpoints every 3 steps, then resumed from step 3: the same model as
    the uninterrupted run, and one test table printed per run (rank 0's)."""
    arguments = [
        *cli_train_arguments(tmp_path),
        "--use_cpu",
        "--batch-size",
        "8",
        "--max-steps",
        "6",
        "--save-strategy",
        "steps",
        "--save-steps",
        "3",
        "--save-total-limit",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    first = torchrun(["-m", "haste_hf.cli", *arguments], tmp_path, timeout=420)
    assert first.stdout.count("Test metrics (%)") == 1, first.stdout
    assert sorted(path.name for path in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    uninterrupted = whole_state(tmp_path / "run")
    metrics = json.loads((tmp_path / "run" / "test_metrics.json").read_text())
    shutil.rmtree(tmp_path / "run" / "checkpoint-6")
    resumed = torchrun(
        ["-m", "haste_hf.cli", *arguments, "--resume-from-checkpoint", str(tmp_path / "run" / "checkpoint-3")],
        tmp_path,
        timeout=420,
    )
    assert resumed.stdout.count("Test metrics (%)") == 1, resumed.stdout
    again = whole_state(tmp_path / "run")
    assert set(again) == set(uninterrupted)
    for name, value in uninterrupted.items():
        torch.testing.assert_close(again[name], value, rtol=0, atol=1e-6, msg=name)
    assert json.loads((tmp_path / "run" / "test_metrics.json").read_text()) == pytest.approx(metrics)
    # `haste-hf evaluate` on two processes: each rank loads its rows of the saved layer; one table, train's metrics.
    evaluate = ["-m", "haste_hf.cli", "evaluate", "--model", tmp_path / "run", "--data", tmp_path / "data"]
    evaluated = torchrun([*evaluate, "--output", tmp_path / "evaluated.json"], tmp_path, timeout=300)
    assert evaluated.stdout.count("metrics (%)") == 1, evaluated.stdout
    again = json.loads((tmp_path / "evaluated.json").read_text())
    assert {name: again[name] for name in metrics} == pytest.approx(metrics)
