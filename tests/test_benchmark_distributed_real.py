# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""benchmarks/distributed.py --mode real with the output layer's memory options, on two CPU processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
TINY = "--labels 3000 --hidden 32 --layers 1 --heads 2 --batch 4 --seq-len 8 --group-size 16 --fan-in 16 --steps 1"
TINY += " --vocab 101 --device cpu"


def run_real(tmp_path, *flags):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT)]
    command += ["--mode", "real", *TINY.split(), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


@pytest.mark.slow
def test_real_mode_takes_the_memory_options(tmp_path):
    out = tmp_path / "real.txt"
    flags = ["--momentum-dtype", "bfloat16", "--fused-update", "--gradient-checkpointing", "--out", str(out)]
    result = run_real(tmp_path, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    header = out.read_text().splitlines()[0]
    assert "x 2" in header and "sharded output layer" in header
    assert "bf16 momentum, chunked loss backward, fused update, encoder checkpointing" in header


@pytest.mark.slow
def test_real_mode_refuses_the_fused_update_of_a_replicated_layer(tmp_path):
    result = run_real(tmp_path, "--replicated", "--fused-update")
    assert result.returncode != 0 and "--fused-update needs the sharded output layer" in result.stderr
