"""Two gloo processes against one: the replicated and the label-sharded output layer (tests/distributed_train.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from haste_hf.distributed import assign_output_layer, balanced_ranges, resolve_shard_output_layer


TESTS = Path(__file__).parent
# fp32 on the CPU: the processes add the same terms in another order, nothing else differs.
LOSS_TOLERANCE = dict(rtol=1e-6, atol=1e-5)
WEIGHT_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def torchrun(script_arguments, tmp_path, processes=2):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *script_arguments]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    return result


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    output = tmp_path_factory.mktemp("two")
    torchrun([str(TESTS / "distributed_train.py"), str(output)], output)
    return output, torch.load(output / "results.pt", weights_only=False)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    import distributed_train

    output = tmp_path_factory.mktemp("one")
    trainer = distributed_train.make_trainer(output / "run", shard=False)
    trainer.train()
    return distributed_train, output, distributed_train.run_summary(trainer)


def assert_states_close(actual: dict, expected: dict, exact_names=("tail.supports", "output_labels")):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        if name in exact_names:
            assert torch.equal(actual[name], value), name
        else:
            torch.testing.assert_close(actual[name], value, **WEIGHT_TOLERANCE, msg=name)


def test_assignment_is_contiguous_and_balanced():
    assert balanced_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert balanced_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    slices = assign_output_layer(head_label_count=5, tail_group_count=9, world_size=2)
    assert [(s.head_rows, s.tail_groups) for s in slices] == [((0, 3), (0, 5)), ((3, 5), (5, 9))]
    with pytest.raises(ValueError, match="every rank needs at least one"):
        assign_output_layer(head_label_count=5, tail_group_count=3, world_size=4)
    assert resolve_shard_output_layer(None, 2) and not resolve_shard_output_layer(None, 1)
    assert not resolve_shard_output_layer(False, 4) and not resolve_shard_output_layer(True, 1)


@pytest.mark.slow
@pytest.mark.parametrize("key, tail_projection_dim", [("gradients", None), ("gradients_projected", 16)])
def test_sharded_step_gives_single_process_loss_and_gradients(two_processes, one_process, key, tail_projection_dim):
    output, results = two_processes
    distributed_train, one_output, _ = one_process
    expected = distributed_train.one_step_gradients(one_output, tail_projection_dim)
    sharded = results[key]
    torch.testing.assert_close(sharded["loss"], expected["loss"], **LOSS_TOLERANCE)
    assert set(sharded["encoder"]) == set(expected["encoder"])
    for name, gradient in expected["encoder"].items():  # DDP's average of the reduce-scattered feature gradients
        torch.testing.assert_close(sharded["encoder"][name], gradient, **WEIGHT_TOLERANCE, msg=name)
    for name, gradient in expected["output_layer"].items():  # gathered from the two shares
        torch.testing.assert_close(sharded["output_layer"][name], gradient, **WEIGHT_TOLERANCE, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["replicated", "sharded"])
def test_two_processes_train_as_one_at_the_same_global_batch(two_processes, one_process, mode):
    """12 steps of global batch 16 (8 per process), 4 rewirings, output-layer clipping: same losses,
    same rewired pairs, same weights as one process with batch 16."""
    _, results = two_processes
    _, _, single = one_process
    run = results[mode]
    assert run["broadcast_buffers"] is False
    assert run["rewirings"] == single["rewirings"] == [(3, 18), (6, 18), (9, 18), (12, 18)]
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(single["losses"]), **LOSS_TOLERANCE)
    assert not torch.equal(single["state"]["tail.supports"], _initial_supports())  # rewiring happened
    assert_states_close(run["state"], single["state"])


@pytest.mark.slow
def test_replicas_stay_identical(two_processes):
    states = two_processes[1]["replica_states"]
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name


@pytest.mark.slow
def test_sharded_run_saves_one_ordinary_model_and_resumes_identically(two_processes):
    from haste_hf import HasteForExtremeClassification

    output, results = two_processes
    sharded = results["sharded"]["state"]
    # save_total_limit=2 with a checkpoint every 4 steps: the last two remain, each a whole model.
    assert results["sharded_checkpoints"] == ["checkpoint-12", "checkpoint-8"]
    for folder in (output / "sharded-model", output / "sharded" / "checkpoint-12"):
        model = HasteForExtremeClassification.from_pretrained(folder)
        assert model.tail.weight.shape == (9, 4, 8) and model.head.weight.shape[0] == 5
        assert (folder / "modeling_haste.py").is_file()  # loadable without haste_hf (trust_remote_code)
        for name, value in model.state_dict().items():
            assert torch.equal(value, sharded[name]), (folder, name)
    optimizer = torch.load(output / "sharded" / "checkpoint-8" / "optimizer.pt", weights_only=True)
    momentum = [entry["momentum_buffer"] for entry in optimizer["output"]["state"].values()]
    assert [tuple(buffer.shape) for buffer in momentum] == [(5, 32), (5,), (9, 4, 8)]  # whole, not one share
    # Resumed from step 8 on two processes: steps 9-12 (one rewiring) as the uninterrupted run.
    resumed = results["resumed"]
    assert resumed["rewirings"] == results["sharded"]["rewirings"]
    assert resumed["losses"] == results["sharded"]["losses"]
    for name, value in sharded.items():
        assert torch.equal(resumed["state"][name], value), name


@pytest.mark.slow
def test_sharded_evaluation_and_prediction_match_one_process(two_processes, tmp_path):
    """Top-k merged over the ranks' labels equals one process's top-k of the saved model."""
    import distributed_train

    from haste_hf import HasteForExtremeClassification

    output, results = two_processes
    model = HasteForExtremeClassification.from_pretrained(output / "sharded-model")
    trainer = distributed_train.make_trainer(tmp_path, shard=False, model=model)
    expected = distributed_train.evaluate_and_predict(trainer)
    sharded = results["sharded_prediction"]
    assert torch.equal(sharded["top_ids"], expected["top_ids"])
    torch.testing.assert_close(sharded["top_scores"], expected["top_scores"], **WEIGHT_TOLERANCE)
    assert sharded["metrics"] == pytest.approx(expected["metrics"])
    torch.testing.assert_close(sharded["eval_loss"], expected["eval_loss"], **LOSS_TOLERANCE)


def _initial_supports():
    import distributed_train

    return distributed_train.make_model().tail.supports
