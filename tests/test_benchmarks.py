# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The kernel-floor arithmetic of benchmarks/kernel_floors.py on a hand-made table."""

import importlib.util
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_floors.py"


@pytest.fixture(scope="module")
def kernel_floors():
    spec = importlib.util.spec_from_file_location("kernel_floors", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
