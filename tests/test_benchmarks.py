# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The kernel-floor arithmetic of benchmarks/kernel_floors.py on a hand-made table, the summary of kernels.py, the
operands of the launch sweeps and the backward sweep's output."""

import signal
import subprocess
import sys

import pytest
import torch
from benchmark_scripts import BENCHMARKS, load_benchmark


@pytest.fixture(scope="module")
def kernel_floors():
    return load_benchmark("kernel_floors")


TABLE = """# header
   B        L    F   G pass       ours ours_det    flops    dense    torch  ratio peakGiB path
 512    8.60M  128  16 bwd_x     37.740   37.598    3.859   10.249        -   9.78   10.25 ttt
 512    8.60M  128  16 fwd       11.384        -    4.427   11.615        -   2.57   10.25 ttt
"""


def test_floors_match_hand_arithmetic(kernel_floors, tmp_path, capsys):
    table = tmp_path / "kernels.txt"
    table.write_text(TABLE)
    rows = kernel_floors.read_table(table)
    assert rows[(512, 8_600_000, 128, 16, "bwd_x")] == (37.740, 3.859)
    # Feature gradient: 512 * 537,500 * 128 partial sums, 8 bytes each, over 33.4 TB/s of shared memory.
    shared = 132 * 128 * 1.98e9
    floor = kernel_floors.floor_ms(512, 8_600_000, 128, 16, "bwd_x", 768, 3.35e12, shared)
    assert floor == pytest.approx(1e3 * 512 * 537_500 * 128 * 8 / shared)
    # Forward: bounded by device memory (logits 512 * 8.6M * 2 bytes dominate), not by the gathers.
    floor = kernel_floors.floor_ms(512, 8_600_000, 128, 16, "fwd", 768, 3.35e12, shared)
    dram = 512 * 8_600_000 * 2 + 8_600_000 * 128 * 2 + 537_500 * 128 * 4 + 512 * 768 * 2
    assert floor == pytest.approx(1e3 * dram / 3.35e12)
    kernel_floors.main([str(table)])
    out = capsys.readouterr().out
    assert "# bwd_x: 1/1 points whose floor alone exceeds 1.15x" in out
    assert "# fwd: 0/1 points" in out


VERSUS = """# NVIDIA H200, torch 2.11.0+cu130, bfloat16, d = 768, ms (median); ours = triton, other = cuda
   B        L    F   G pass       ours ours_det    flops    dense    torch  ratio peakGiB path    other other_det    vs vs_det
  64    8.60M   32  16 fwd       1.145        -    0.540    3.520        -   2.12    1.54 ttt    0.826         -  1.39
  64    8.60M   32  16 bwd_x     1.987    3.233    0.393    3.170        -   5.06    1.54 ttt    1.242     1.238  1.60   2.61
 512    8.60M   32  16 fwd       4.981        -    3.417   11.512        -   1.46    8.72 ttt    5.840         -  0.85
"""


@pytest.fixture(scope="module")
def kernels_benchmark():
    return load_benchmark("kernels")


def test_kernels_summary_reads_a_table_cut_short(kernels_benchmark, tmp_path):
    """`kernels.py --summarize` gives each pass's median and worst Triton / CUDA ratio of a table whose run was
    stopped before its own summary (a device call's time limit)."""
    table = tmp_path / "kernels.txt"
    table.write_text(VERSUS)
    lines = kernels_benchmark.summarize(table)
    assert lines[0] == "# fwd: triton / cuda median 1.12, max 1.39 at B=64 L=8.60M F=32 G=16, <= 1.3: 1/2"
    assert lines[1] == "# bwd_x: triton / cuda median 1.60, max 1.60 at B=64 L=8.60M F=32 G=16, <= 1.3: 0/1"
    assert lines[2] == "# bwd_x_det: triton / cuda median 2.61, max 2.61 at B=64 L=8.60M F=32 G=16, <= 1.3: 0/1"
    assert len(lines) == 3


def test_sweep_operands_are_a_valid_tail_of_whole_groups(kernels_benchmark):
    """The operands both launch sweeps time on (built on the CPU here): L rounded down to whole groups, each group's
    support F distinct features in range, positives among the labels."""
    labels, [(x, weight, supports, positions)] = kernels_benchmark.sweep_operands(6, 0.000103, 8, 4, 32, device="cpu")
    assert labels == 100 and weight.shape == (25, 4, 8) and x.shape == (6, 32) and positions.shape == (6, 8)
    assert x.dtype == weight.dtype == torch.bfloat16 and supports.dtype == torch.int32 and supports.shape == (25, 8)
    assert all(len(set(row)) == 8 for row in supports.tolist()) and supports.min() >= 0 and supports.max() < 32
    assert positions.min() >= 0 and positions.max() < labels


SWEEP_KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import triton_backward_sweep as sweep

sweep.ops.is_available = lambda: True
sweep.torch.cuda.get_device_name = lambda: "no GPU"


def time_shape(batch, millions, fan_in, group, passes, features, deadline, emit):
    emit(f"## B={batch} {'+'.join(passes)}")
    if batch == 2:  # as `timeout` or a device call's limit stops the run
        os.kill(os.getpid(), signal.SIGKILL)
    return [f"# best B={batch}"]


sweep.time_shape = time_shape
sweep.main(["--shapes", "1,8.6,32,16:bwd_w", "2,8.6,32,16", "--passes", "bwd_x", "--out", sys.argv[2]])
"""


def test_backward_sweep_keeps_its_lines_when_killed(tmp_path):
    """triton_backward_sweep.py writes each line to `--out` as it is measured: a run killed mid-shape (a device
    call's time limit) leaves the header and every shape's lines up to the kill (its shapes timed by a stand-in
    here: no GPU)."""
    out = tmp_path / "sweep.txt"
    run = subprocess.run(
        [sys.executable, "-c", SWEEP_KILLED, str(BENCHMARKS), str(out)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == -signal.SIGKILL, run.stderr
    assert out.read_text().splitlines() == [
        "# no GPU, bf16, d = 768: ms (median), triton / cuda",
        "## B=1 bwd_w",
        "## B=2 bwd_x",
    ]
