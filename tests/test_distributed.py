import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


TESTS = Path(__file__).parent


@pytest.mark.slow
def test_two_process_gloo_training_rewires_identically(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(TESTS / "distributed_train.py"), str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert all(summary["world_size"] == 2 for summary in ranks)
    assert all(summary["broadcast_buffers"] is False for summary in ranks)
    assert all(summary["rewirings"] == [3, 6, 9, 12] for summary in ranks)
    losses = ranks[0]["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    states = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    initial_supports = _initial_supports()
    assert not torch.equal(states[0]["supports"], initial_supports)  # rewiring happened
    for name in ("supports", "tail", "head"):
        assert torch.equal(states[0][name], states[1][name]), name


def _initial_supports():
    from tiny_encoders import tiny_encoder_config

    from haste_hf import HasteConfig, HasteForExtremeClassification

    model = HasteForExtremeClassification(
        HasteConfig(encoder=tiny_encoder_config("bert"), label_count=40, head_label_count=4, group_size=4, fan_in=8)
    )
    return model.tail.supports
