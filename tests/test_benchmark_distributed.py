# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""benchmarks/distributed.py: the collective arithmetic by hand, and both modes on tiny CPU sizes."""

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark, load_script
from launch import torchrun


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "distributed.py"
TINY = [
    "--labels",
    "3000",
    "--hidden",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--batch",
    "4",
    "--seq-len",
    "8",
    "--group-size",
    "16",
    "--fan-in",
    "16",
    "--steps",
    "1",
    "--vocab",
    "101",
    "--device",
    "cpu",
]


@pytest.fixture(scope="module")
def benchmark():
    return load_script(SCRIPT)


def test_collective_bytes_and_ring_times_by_hand(benchmark):
    args = benchmark.parse_args(
        [
            "--labels",
            "1000",
            "--head-fraction",
            "0.1",
            "--group-size",
            "32",
            "--fan-in",
            "64",
            "--hidden",
            "768",
            "--batch",
            "128",
            "--positives",
            "5",
        ]
    )
    steps = {
        name: (operation, size, layouts) for name, operation, size, layouts in benchmark.collectives(args, 2, 10**6)
    }
    assert steps["branch inputs (bf16)"] == ("all_gather", 256 * 768 * 2, ("sharded",))
    assert steps["feature gradient (bf16)"][1] == 256 * 768 * 2
    assert steps["positive label ids (int64)"][1] == 256 * 5 * 8
    # Head 100 labels x (768 + 1); tail 900 labels in 29 groups of 32 x 64 weights; bf16.
    assert steps["output-layer gradient, DDP (bf16)"] == ("all_reduce", (29 * 32 * 64 + 100 * 769) * 2, ("replicated",))
    sharded = benchmark.collectives(args, 2, 10**6)
    # Two ranks: half of each gathered/scattered tensor crosses the link, all of each all-reduced one.
    expected = (2 * 16 + 256 * 768 * 2 + 256 * 40 + 256 * 768 * 2) / 2 + 256 * 4 + 4 * 10**6
    assert benchmark.communication_seconds(sharded, 2, 1.0, "sharded") == pytest.approx(expected / 1e9)
    assert benchmark.communication_seconds(sharded, 1, 1.0, "sharded") == 0.0
    assert benchmark.layout(args, 4) == {"head": 25, "groups": 8, "head_total": 100, "groups_total": 29}


@pytest.mark.slow
def test_emulation_runs_on_the_cpu(benchmark, tmp_path):
    benchmark.main([*TINY, "--world-sizes", "1", "2", "--out", str(tmp_path / "table.txt")])
    table = (tmp_path / "table.txt").read_text()
    assert "One rank of an N-way split" in table and "sharded" in table and "replicated" in table


@pytest.mark.slow
def test_real_mode_runs_under_torchrun(tmp_path):
    result = torchrun([SCRIPT, "--mode", "real", *TINY], tmp_path, timeout=300)
    assert "sharded output layer" in result.stdout and "texts/s" in result.stdout


@pytest.mark.slow
def test_emulation_with_the_memory_options_on_the_cpu(benchmark, tmp_path):
    benchmark.main(
        [
            *TINY,
            "--world-sizes",
            "1",
            "2",
            "--momentum-dtype",
            "bfloat16",
            "--chunk-labels",
            "8",
            "--fused-update",
            "--out",
            str(tmp_path / "table.txt"),
        ]
    )
    table = (tmp_path / "table.txt").read_text()
    assert "SGD, bf16 momentum, chunked loss backward, fused update" in table
    assert "state: bf16 weights and bfloat16 momentum, 4 bytes a parameter" in table


def test_the_commit_says_where_it_was_read(monkeypatch, tmp_path):
    """The device runs a copy of the tree inside another checkout: git's HEAD there is not the tree's commit."""
    import shutil
    import subprocess

    provenance = load_benchmark("provenance")
    monkeypatch.setenv("HASTE_COMMIT", "abc1234")
    assert provenance.tree_commit() == "abc1234 (HASTE_COMMIT)"
    monkeypatch.delenv("HASTE_COMMIT")
    assert provenance.tree_commit().startswith(
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        + " (git HEAD"
    )
    outer = tmp_path / "outer"
    (outer / "copy" / "benchmarks").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(outer),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        check=True,
    )
    shutil.copy(ROOT / "benchmarks" / "provenance.py", outer / "copy" / "benchmarks")
    copied = load_script(outer / "copy" / "benchmarks" / "provenance.py")
    assert copied.tree_commit().startswith("unknown (no HASTE_COMMIT; git's HEAD ")
