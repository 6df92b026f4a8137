"""benchmarks/memory_plan_at.py: a rank's share and its plan, at a label count small enough to count by hand."""

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def memory_plan_at():
    return load_benchmark("memory_plan_at")


def test_the_share_of_rank_0_and_its_buffers(memory_plan_at, capsys):
    """10,000 labels on 2 GPUs, G 16, F 8, head 3%: 300 head rows (150 a rank) and 9,700 tail labels in 607 groups
    (304 for rank 0); its buffers: 304 x 8 int32 supports, 150 + 304 x 16 int64 label ids and their int32 lookup."""
    model = memory_plan_at.share_model(10_000, 2, group_size=16, fan_in=8, head_fraction=0.03)
    layer = model.output_layer
    assert (layer.head_label_count, layer.tail_group_count) == (150, 304)
    positions = 150 + 304 * 16
    from haste_hf.training.memory_plan import output_buffer_bytes

    assert output_buffer_bytes(layer, sharded=True) == 304 * 8 * 4 + positions * 8 + positions * 8
    memory_plan_at.main(["--labels", "1e4", "--gpus", "2", "--fan-in", "8", "--output-momentum", "0"])
    printed = capsys.readouterr().out
    assert "rank 0's share: 150 head rows, 304 tail groups" in printed
    assert "momentum 0.0 GiB" in printed and "Memory plan: output layer" in printed and ": fits" in printed
