"""Two gloo processes against one: the replicated and the label-sharded output layer (tests/distributed_train.py)."""

import json
import uuid

import pytest
import torch
from launch import (
    LOSS_TOLERANCE,
    TESTS,
    WEIGHT_TOLERANCE,
    assert_momentum_in_shards,
    assert_states_close,
    cli_train_arguments,
    gloo_group_of_one,
    torchrun,
    whole_state,
)
from tiny_haste import make_tiny_model

from haste_hf.labels.layout import LabelLayout
from haste_hf.modeling.initialization import deferred_output_rows
from haste_hf.modeling.output_layer import HasteOutputLayer
from haste_hf.training.distributed import balanced_ranges
from haste_hf.training.sharded_output_layer import (
    _fingerprint,
    _multi_hot_to_ids,
    assign_output_layer,
    resolve_shard_output_layer,
)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, hub):
    output = tmp_path_factory.mktemp("two")
    repo_id = f"{hub.user}/sharded-{uuid.uuid4().hex[:8]}"
    torchrun([str(TESTS / "distributed_train.py"), str(output), repo_id], output)  # the test Hub's environment
    results = torch.load(output / "results.pt", weights_only=False)
    results["repo_id"] = repo_id
    return output, results


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    import distributed_train

    output = tmp_path_factory.mktemp("one")
    trainer = distributed_train.make_trainer(output / "run", shard=False)
    trainer.train()
    return distributed_train, output, distributed_train.run_summary(trainer)


def test_assignment_is_contiguous_and_balanced():
    assert balanced_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert balanced_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    slices = assign_output_layer(head_label_count=5, tail_group_count=9, world_size=2)
    assert [(s.head_rows, s.tail_groups) for s in slices] == [((0, 3), (0, 5)), ((3, 5), (5, 9))]
    shares = assign_output_layer(
        head_label_count=2, tail_group_count=3, world_size=4
    )  # the last ranks' shares are empty
    assert [(s.head_rows, s.tail_groups) for s in shares] == [
        ((0, 1), (0, 1)),
        ((1, 2), (1, 2)),
        ((2, 2), (2, 3)),
        ((2, 2), (3, 3)),
    ]
    layout = LabelLayout(label_count=40, head_ids=torch.arange(5), tail_order=torch.arange(5, 40), group_size=4)
    assert assign_output_layer(layout.head_label_count, layout.tail_group_count, 2) == slices
    assert resolve_shard_output_layer(None, 2) and not resolve_shard_output_layer(None, 1)
    assert not resolve_shard_output_layer(False, 4) and not resolve_shard_output_layer(True, 1)


@pytest.mark.parametrize("head_label_count", [0, 12], ids=["no head", "no tail"])
def test_the_fingerprint_the_ranks_compare_covers_a_layer_with_no_head_or_no_tail(head_label_count):
    """What `ShardedOutputLayer.shard` all-reduces to check that the ranks hold one layer: the label order and the
    sum of each tensor of the branch the layer has; a weight or a label order that differs changes it."""
    layer = HasteOutputLayer(16, 12, head_labels=head_label_count, group_size=4, fan_in=4)
    branch = layer.tail if head_label_count == 0 else layer.head
    assert (layer.head, layer.tail).count(None) == 1
    fingerprint = _fingerprint(layer)
    tensors = branch.state_dict()
    labels = layer.output_labels.double()
    expected = [(labels * torch.arange(1, labels.numel() + 1)).sum(), *(t.double().sum() for t in tensors.values())]
    torch.testing.assert_close(fingerprint, torch.stack(expected), rtol=0, atol=0)
    with torch.no_grad():
        branch.weight.view(-1)[0] += 0.5
    assert not torch.equal(_fingerprint(layer), fingerprint)
    with torch.no_grad():
        branch.weight.view(-1)[0] -= 0.5
        layer.output_labels[[0, 1]] = layer.output_labels[[1, 0]]
    assert not torch.equal(_fingerprint(layer), fingerprint)


def test_the_fingerprint_of_a_layer_left_to_build_tells_apart_seeds_past_2_to_the_53():
    """A layer built within `deferred_output_rows` has no values yet: its fingerprint holds the seeds its rows will be
    drawn from, exactly (a float64 holds 2**53; the weight seed is drawn below 2**62), so ranks whose seeds differ by
    one past 2**53 are told apart."""
    with deferred_output_rows():
        layer = make_tiny_model(label_count=30, head_label_count=4).output_layer
    fingerprints = {}
    for seed in (5, 2**53, 2**53 + 1, 2**62 - 2, 2**62 - 1):
        layer.initial_weight_seed = seed
        fingerprint = _fingerprint(layer)
        assert fingerprint[1:].tolist() == [seed % 2**53, seed >> 53, layer.supports_seed], seed
        fingerprints[seed] = fingerprint
    assert len({tuple(fingerprint.tolist()) for fingerprint in fingerprints.values()}) == len(fingerprints)


def test_the_fingerprint_tells_apart_label_orders_that_differ_past_2_to_the_24_positions():
    """Positions weigh the labels in float64: in float32, positions 2^24 and 2^24 + 1 are one number, and ranks whose
    orders swap those two labels would shard together."""
    import types

    labels = torch.arange(2**24 + 2)
    layer = types.SimpleNamespace(output_labels=labels, head=None, tail=None)
    before = _fingerprint(layer)
    labels[[2**24 - 1, 2**24]] = labels[[2**24, 2**24 - 1]].clone()
    assert not torch.equal(_fingerprint(layer), before)


def test_sharding_without_a_process_group_is_refused_naming_the_launchers():
    import torch.distributed as dist

    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    assert not dist.is_initialized()
    layer = HasteOutputLayer(16, 12, head_labels=4, group_size=4, fan_in=4)
    with pytest.raises(RuntimeError, match=r"needs an initialised torch.distributed process group \(torchrun"):
        ShardedOutputLayer.shard(layer)


@pytest.mark.slow
def test_each_rank_builds_only_its_share_of_the_output_layer(tmp_path):
    """A model built within `deferred_output_rows` and sharded over 2 ranks: each rank's rows equal its slice of the
    model built whole (the same model whatever the rank count), every other tensor equals the whole model's, and the
    peak memory the build adds on a rank follows its share (half the tail's bytes), below the whole tail's."""
    torchrun([str(TESTS / "distributed_shard_build.py"), str(tmp_path)], tmp_path, timeout=300)
    results = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]
    for result in results:
        whole_tail = 2 * result["local_tail_bytes"]
        # Built whole then cut, the whole tail and the share's copy: 1.5x the whole tail. The label positions, whole
        # on every rank, add 8 bytes a label (a quarter of the share here).
        assert result["local_tail_bytes"] <= result["added_peak"] < whole_tail, result
        head_rows, tail_groups = (slice(*rows) for rows in result["rows"])
        labels = slice(tail_groups.start * 4, tail_groups.stop * 4)  # G = 4
        for name, whole in result["whole"].items():
            rows = {"head.weight": head_rows, "head.bias": head_rows, "tail.bias": labels}.get(
                name.removeprefix("output_layer."), tail_groups if name.startswith("output_layer.tail.") else None
            )
            if name == "output_layer.output_labels":  # the label ids of the share's positions alone: head, then tail
                whole = torch.cat([whole[head_rows], whole[13 + labels.start : 13 + labels.stop]])  # H = 13
            assert torch.equal(result["share"][name], whole if rows is None else whole[rows]), name
    assert [r["rows"] for r in results] == [((0, 7), (0, 10)), ((7, 13), (10, 20))]
    # Each label's position comes from the one rank that holds it; no rank holds an [L] map of every label.
    positions = torch.stack([r["positions"].flatten() for r in results])
    assert torch.equal((positions >= 0).sum(0), torch.ones(90, dtype=torch.int64))
    assert torch.equal(positions.max(0).values, results[0]["whole_positions"])
    assert all("no [label_count] map" in r["label_positions_refused"] for r in results)


@pytest.mark.slow
def test_a_rank_builds_its_share_of_a_model_of_12m_labels_without_an_array_of_every_label(tmp_path):
    """`haste-hf train`'s build of a sharded model (a layout, `deferred_output_rows`, `shard`) on 2 ranks, 12M labels:
    the host memory a rank adds beyond the share it keeps stays under half an [L] int64 array (the whole
    `output_labels`, 8 GB at 10^9 labels, took two such arrays and a third in transit), and the share's label ids are
    the layout's."""
    torchrun([str(TESTS / "distributed_build_memory.py"), str(tmp_path)], tmp_path, timeout=300)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank-{rank}.pt")
        whole_labels = 8 * result["label_count"]
        assert result["labels_equal"], rank
        assert result["kept"] >= whole_labels / 2, result  # the share's label ids and tail weights
        assert result["added_peak"] - result["kept"] < whole_labels / 2, result


@pytest.mark.slow
def test_each_rank_starts_its_share_from_its_own_labels_texts(tmp_path):
    """`init_share_from_label_texts_` on 2 ranks: each rank's rows equal its slice of the model started whole from
    every label's text in one process (the same center, from rank 0), the blank label's rows left random alike; each
    rank embeds its own labels' texts (and rank 0 the center's sample), not every label's."""
    torchrun([str(TESTS / "distributed_label_text_init.py"), str(tmp_path)], tmp_path, timeout=300)
    results = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]
    assert [r["rows"] for r in results] == [((0, 7), (0, 10)), ((7, 13), (10, 20))]
    assert sum(r["initialised"] for r in results) == 89  # label 5's text is blank
    assert results[1]["embedded"] == results[1]["initialised"]  # its own labels' texts alone
    assert results[0]["embedded"] == results[0]["initialised"] + 89  # and the center's sample: every text here
    for result in results:
        head_rows, tail_groups = (slice(*rows) for rows in result["rows"])
        for name in ("output_layer.head.weight", "output_layer.tail.weight", "output_layer.tail.supports"):
            rows = head_rows if name.startswith("output_layer.head.") else tail_groups
            torch.testing.assert_close(result["share"][name], result["whole"][name][rows], rtol=1e-5, atol=1e-6)
        assert not torch.equal(result["whole"]["output_layer.tail.weight"], make_whole_random_tail()), "not started"


@pytest.mark.slow
def test_the_center_of_a_sharded_label_text_init_ends_on_every_rank(tmp_path):
    """Rank 0 alone embeds the center and broadcasts it: where every text is blank, each rank initialises none of
    its labels, as one process does (rank 0 raised alone, and rank 1 waited in the broadcast); where rank 0 fails to
    embed it, every rank raises (rank 0 its own error), none waits."""
    torchrun([str(TESTS / "distributed_label_text_center.py"), str(tmp_path)], tmp_path, timeout=300)
    results = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    assert [(r["initialised"], r["unchanged"]) for r in results] == [(0, True), (0, True)]
    assert results[0]["error"] == "ValueError: planted: the center's embedding failed"
    assert results[1]["error"].startswith("RuntimeError: Rank 0 failed to embed the label texts' mean")


def make_whole_random_tail():
    import distributed_label_text_init as script

    return make_tiny_model(**script.MODEL).state_dict()["output_layer.tail.weight"]


@pytest.mark.slow
def test_row_gather_and_its_backward_with_unequal_shares(tmp_path):
    """Ranks of 5 and 11 rows (and 11 + 5, 1 + 15, 8 + 8): every rank gets all rows in rank order, and each
    row's gradient is the sum over ranks of what their losses give it, times the gradient scale."""
    import distributed_gather as script

    torchrun([str(TESTS / "distributed_gather.py"), str(tmp_path)], tmp_path, timeout=420)
    results = [torch.load(tmp_path / f"rank-{rank}.pt") for rank in range(2)]
    for counts in script.COUNTS:
        every_row = torch.cat([script.rows(rank, counts) for rank in range(2)])
        starts = [0, counts[0], sum(counts)]
        for rank in range(2):
            result = results[rank][tuple(counts)]
            assert torch.equal(result["gathered"], every_row), counts
            expected = (
                script.GRAD_SCALE
                * sum(script.weights(other, counts) for other in range(2))[starts[rank] : starts[rank + 1]]
            )
            torch.testing.assert_close(result["grad"], expected, msg=str(counts))
        assert (
            torch.equal(results[0][tuple(counts)]["to_cpu"], every_row) and results[1][tuple(counts)]["to_cpu"] is None
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "key, tail_projection_dim, dense", [("gradients", None, False), ("gradients_projected", 16, True)]
)
def test_sharded_step_gives_single_process_loss_and_gradients(
    two_processes, one_process, key, tail_projection_dim, dense
):
    """Without projections the head and tail read one gathered tensor; with one, the two inputs go in one
    gather; labels as padded ids and as a dense multi-hot."""
    output, results = two_processes
    distributed_train, one_output, _ = one_process
    expected = distributed_train.one_step_gradients(one_output, tail_projection_dim, dense)
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
    assert not torch.equal(single["state"]["output_layer.tail.supports"], _initial_supports())  # rewiring happened
    assert_states_close(run["state"], single["state"])


@pytest.mark.slow
def test_each_rank_draws_its_own_dropout_masks(two_processes, tmp_path):
    """Seeded alike, two ranks would drop the same units of their examples; one process draws fresh masks
    for every example. Rank 0 keeps the single process's stream (the data order is covered above)."""
    import distributed_train

    distributed_train.make_trainer(tmp_path, shard=False)
    single = torch.rand(4)
    streams = two_processes[1]["dropout_streams"]
    assert torch.equal(streams[0], single)
    assert not torch.equal(streams[1], streams[0])


@pytest.mark.slow
def test_replicas_stay_identical(two_processes):
    states = two_processes[1]["replica_states"]
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name


@pytest.mark.slow
def test_sharded_run_saves_and_pushes_its_model_in_row_shards_and_resumes_identically(two_processes):
    from haste_hf import HasteForExtremeClassification
    from haste_hf.modeling.output_shards import OUTPUT_SHARDS_INDEX

    output, results = two_processes
    sharded = results["sharded"]["state"]
    # save_total_limit=2 with a checkpoint every 4 steps: the last two remain, each a whole model.
    assert results["sharded_checkpoints"] == ["checkpoint-12", "checkpoint-8"]
    for folder in (output / "sharded-model", output / "sharded" / "checkpoint-12"):
        model = HasteForExtremeClassification.from_pretrained(folder)
        assert model.output_layer.tail.weight.shape == (9, 4, 8) and model.output_layer.head.weight.shape[0] == 5
        assert (folder / "modeling_haste.py").is_file()  # loadable without haste_hf (trust_remote_code)
        assert (folder / OUTPUT_SHARDS_INDEX).is_file()  # the output layer as the ranks wrote it, not gathered
        for name, value in model.state_dict().items():
            assert torch.equal(value, sharded[name]), (folder, name)
    pushed = HasteForExtremeClassification.from_pretrained(results["repo_id"])  # Trainer.push_to_hub of the sharded run
    for name, value in pushed.state_dict().items():
        assert torch.equal(value, sharded[name]), name
    assert_momentum_in_shards(output / "sharded" / "checkpoint-8")
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

    return distributed_train.make_model().output_layer.tail.supports


@pytest.mark.slow
def test_cli_train_on_two_processes_equals_one(tmp_path):
    """`torchrun -m haste_hf.cli train` (sharded by default) against one process at the same global batch:
    semantic grouping on rank 0 only, validation and best-checkpoint selection, test evaluation split over
    the ranks, one model saved."""
    from haste_hf.cli import main

    arguments = cli_train_arguments(tmp_path)
    # On CPUs the processes join a gloo group only with --use_cpu (without it the recipe refuses to run).
    launched = torchrun(
        ["-m", "haste_hf.cli", *arguments, "--use_cpu", "--output-dir", str(tmp_path / "two"), "--batch-size", "8"],
        tmp_path,
    )
    # A small label set at a small batch: the user is told, once, that one process would train as fast.
    assert (launched.stdout + launched.stderr).count("2 processes will likely train slower than one") == 1
    assert main([*arguments, "--output-dir", str(tmp_path / "one"), "--batch-size", "16"]) == 0
    one, two = whole_state(tmp_path / "one"), whole_state(tmp_path / "two")
    assert set(one) == set(two) and torch.equal(one["output_layer.tail.supports"], two["output_layer.tail.supports"])
    for name, value in one.items():
        # 54 steps of AdamW at 3e-3 with clipping grow the fp32 summation-order differences to ~2e-3 (the
        # 12-step test above holds 1e-5); a wrong reduction or data order would be off by far more.
        torch.testing.assert_close(two[name], value, rtol=0, atol=1e-2, msg=name)
    metrics = [json.loads((tmp_path / run / "test_metrics.json").read_text()) for run in ("one", "two")]
    assert metrics[1] == pytest.approx(metrics[0])
    assert metrics[0]["P@1"] > 0.3  # it learned: the comparison is not between two untrained models


@pytest.mark.parametrize("action", ["stop", "skip"])
def test_a_nan_on_one_rank_stops_or_skips_on_every_rank(tmp_path, action):
    # Ranks that disagreed would wait for each other in the next collective: a hang, cut short here (a run: ~100 s).
    torchrun([str(TESTS / "distributed_non_finite.py"), str(tmp_path), action], tmp_path, timeout=420)
    outcomes = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    if action == "stop":
        assert all(outcome["error"] and "diverged at step 3" in outcome["error"] for outcome in outcomes)
        assert [outcome["step"] for outcome in outcomes] == [2, 2]
    else:
        assert [(outcome["error"], outcome["step"], outcome["skipped"]) for outcome in outcomes] == [(None, 5, 1)] * 2


def test_rows_gathered_to_the_cpu_in_pieces_on_a_group_of_one_process(tmp_path, monkeypatch):
    """`gather_rows_to_cpu` on a one-process gloo group, two rows a piece (the two-process case is the slow torchrun
    test above): the destination rank gets every row, in order, on the CPU."""
    from haste_hf.training import distributed

    rows = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(distributed, "_GATHER_CHUNK_BYTES", 2 * rows[0].nbytes)
    with gloo_group_of_one(tmp_path):
        gathered = distributed.gather_rows_to_cpu(rows, [rows.shape[0]])
    assert torch.equal(gathered, rows)


def test_sharding_refuses_ranks_that_hold_different_layers(tmp_path, monkeypatch):
    """`ShardedOutputLayer.shard` compares the ranks' fingerprints by a MIN and a MAX all-reduce. On a one-process
    gloo group, the other rank is an all-reduce that meets its fingerprint: the same layer shards, another is refused
    (two real ranks need torchrun)."""
    import torch.distributed as dist

    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    def layer(seed):
        torch.manual_seed(seed)
        return HasteOutputLayer(16, 12, head_labels=4, group_size=4, fan_in=4)

    def other_rank_holds(other):
        def all_reduce(tensor, op, group=None):
            reduce = torch.minimum if op == dist.ReduceOp.MIN else torch.maximum
            tensor.copy_(reduce(tensor, _fingerprint(other).to(tensor)))

        monkeypatch.setattr(dist, "all_reduce", all_reduce)

    with gloo_group_of_one(tmp_path):
        other_rank_holds(layer(0))
        assert ShardedOutputLayer.shard(layer(0)).label_count == 12
        other_rank_holds(layer(1))
        with pytest.raises(ValueError, match="The ranks hold different output layers or label orders: build the"):
            ShardedOutputLayer.shard(layer(0))


def test_a_sharded_layers_top_k_on_a_group_of_one_process_is_the_layers(tmp_path):
    """`ShardedOutputLayer.topk` (every rank's top-k of the gathered batch, merged per example) on a one-process gloo
    group ranks as the layer it was cut from, with k above the layer's head and below its label count (two real ranks
    are the slow torchrun tests above)."""
    import copy

    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    torch.manual_seed(0)
    layer = HasteOutputLayer(16, 30, head_labels=4, group_size=4, fan_in=4).eval()
    real = layer.output_labels >= 0  # a label order other than the identity; padding slots kept
    layer.output_labels[real] = layer.output_labels[real][torch.randperm(30)]
    features = torch.randn(5, 16)
    expected = layer.topk(features, 7)
    with gloo_group_of_one(tmp_path):
        top = ShardedOutputLayer.shard(copy.deepcopy(layer)).eval().topk(features, 7)
    assert torch.equal(top.label_ids, expected.label_ids)
    torch.testing.assert_close(top.scores, expected.scores, rtol=0, atol=0)


def test_a_sharded_layers_rewiring_scores_a_tail_label_0_as_the_layer_does(tmp_path):
    """`ShardedOutputLayer.rewire_` on a one-process gloo group rewires as the layer it was cut from: label id 0,
    alone in the last tail group beside 3 padding slots, is a label whose weights decide the slot rewired (were it
    taken for padding, its group would have none to score); the padding slots' weights do not."""
    import copy

    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    layout = LabelLayout(
        label_count=10, head_ids=torch.tensor([9]), tail_order=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 0]), group_size=4
    )
    layer = HasteOutputLayer(16, head_labels=layout, fan_in=4)
    with torch.no_grad():
        layer.tail.weight[2, 0] = torch.tensor([0.5, 0.01, 0.9, 0.7])  # label 0: slot 1 is its weakest
        layer.tail.weight[2, 1:] = torch.tensor([0.0, 5.0, 0.0, 0.0])  # padding: scored too, slot 0 would be
    with gloo_group_of_one(tmp_path):
        sharded = ShardedOutputLayer.shard(copy.deepcopy(layer))
        result, count = sharded.rewire_(fraction=0.25, scope="group", init="zero", seed=0, step=1)
    expected, expected_count = layer.rewire_(fraction=0.25, scope="group", init="zero", seed=0, step=1)
    assert count == expected_count == 3 and result.slots[result.groups == 2].tolist() == [1]
    for name in ("groups", "slots", "old_features", "new_features"):
        assert torch.equal(getattr(result, name), getattr(expected, name)), name
    assert torch.equal(sharded.tail.supports, layer.tail.supports)
    assert torch.equal(sharded.tail.weight, layer.tail.weight)


def test_a_sharded_model_loads_a_checkpoint_folder_on_a_group_of_one_process(tmp_path):
    """`load_folder_rows_` (a resume of a label-sharded run) of a one-file folder on a one-process gloo group: every
    tensor of the saved model, the layer's share included, is loaded as saved."""

    from haste_hf.training.shard_checkpoints import load_folder_rows_
    from haste_hf.training.sharded_output_layer import shard_output_layer_

    saved = make_tiny_model(seed=1)
    saved.save_pretrained(tmp_path / "checkpoint")
    model = make_tiny_model(seed=0)
    with gloo_group_of_one(tmp_path):
        shard_output_layer_(model)
        load_folder_rows_(model, tmp_path / "checkpoint")
    loaded = model.state_dict()
    assert set(loaded) == set(saved.state_dict())
    for name, tensor in saved.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_broadcast_of_an_object_without_a_process_group_is_the_object_itself():
    from haste_hf.training.distributed import broadcast_object

    value = {"seed": 3}
    assert broadcast_object(value) is value


def test_broadcast_through_a_file_without_a_process_group_is_the_value_itself_and_writes_nothing(tmp_path):
    from haste_hf.training.distributed import broadcast_through_file

    def refused(*args):
        raise AssertionError("one process writes and reads no file")

    value = {"layout": 3}
    assert broadcast_through_file(value, tmp_path / "shared", refused, refused) is value
    assert not (tmp_path / "shared").exists()


def test_multi_hot_labels_become_positive_ids_padded_to_the_longest_row():
    """What the sharded layer's loss reads of a `[B, L]` multi-hot batch; a rank's share of a batch may be empty."""
    labels = torch.zeros(3, 6, dtype=torch.bool)
    labels[0, [1, 4]] = labels[2, [0, 2, 5]] = True
    assert _multi_hot_to_ids(labels).tolist() == [[1, 4, -100], [-100] * 3, [0, 2, 5]]
    assert _multi_hot_to_ids(torch.zeros(0, 6, dtype=torch.bool)).shape == (0, 0)


def test_a_ranks_rows_are_padded_to_the_largest_share_for_the_gather():
    from haste_hf.training.distributed import _padded

    rows = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(_padded(rows, 2), rows)
    padded = _padded(rows, 4, value=-1.0)
    assert padded.shape == (4, 3) and torch.equal(padded[:2], rows) and bool((padded[2:] == -1).all())


def test_the_label_layout_reaches_every_rank_through_a_file_not_a_collective(tmp_path):
    """At 10^9 labels the layout is 16 GB: pickled through `broadcast_object`, it would cross every GPU. Rank 0 writes
    it to a file the others read; only the file's path is broadcast, and the file is removed. Where a rank cannot read
    it, every rank takes the broadcast copy."""
    torchrun([str(TESTS / "distributed_layout_file.py"), str(tmp_path)], tmp_path, timeout=300)
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]
    for results in ranks:
        for shared in (results["shared"], results["fallback"]):
            for name, value in ranks[0]["shared"].items():
                assert torch.equal(shared[name], value) if isinstance(value, torch.Tensor) else shared[name] == value
        assert "LabelLayout" not in results["carried"] and results["left"] == [] and results["left_after"] == []
        assert "LabelLayout" in results["fallback_carried"]
    assert ranks[0]["shared"]["strategy"] == "random" and ranks[0]["shared"]["tail_order"].numel() == 32


def test_a_sharded_layers_loss_top_k_clipping_and_whole_state_on_a_group_of_one_process_are_the_layers(tmp_path):
    """On a one-process gloo group (two real ranks are the slow torchrun tests above), the share of a layer with a
    head bias and shuffled labels gives the layer's loss and gradients for padded ids and for 0/1 multi-hot labels,
    its top-k, its clipping of the output gradients, and its whole state and optimizer rows back; soft targets,
    logits and the `[label_count]` position map are refused naming what to do instead."""
    import copy

    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    torch.manual_seed(0)
    layer = HasteOutputLayer(16, 30, head_labels=4, group_size=4, fan_in=4)
    real = layer.output_labels >= 0
    layer.output_labels[real] = layer.output_labels[real][torch.randperm(30)]
    features = torch.randn(5, 16)
    ids = torch.tensor([[3, 17, -100], [0, -100, -100], [29, 4, 11], [-100, -100, -100], [8, 22, 5]])
    multi_hot = torch.zeros(5, 30)
    for row, row_ids in enumerate(ids.tolist()):
        multi_hot[row, [i for i in row_ids if i >= 0]] = 1.0
    expected = layer(features, labels=ids, top_k=6)
    expected.loss.backward()
    expected_grads = [p.grad.clone() for p in layer.output_parameters()]
    expected_state = layer.state_dict()
    with gloo_group_of_one(tmp_path):
        unused = copy.deepcopy(layer)
        unused.zero_grad(set_to_none=True)
        sharded = ShardedOutputLayer.shard(unused)
        out = sharded(features, labels=ids, top_k=6)
        out.loss.backward()
        torch.testing.assert_close(out.loss, expected.loss)
        for grad, expected_grad in zip([p.grad for p in sharded.output_parameters()], expected_grads):
            torch.testing.assert_close(grad, expected_grad)
        assert torch.equal(out.top_label_ids, expected.top_label_ids)
        torch.testing.assert_close(out.top_scores, expected.top_scores)
        torch.testing.assert_close(sharded(features, labels=multi_hot).loss, expected.loss)
        assert sharded(features).loss is None and sharded(features).top_label_ids is None
        assert torch.equal(sharded.positive_positions(ids), layer.positive_positions(ids))
        soft = multi_hot * 0.5
        with pytest.raises(ValueError, match="0/1 multi-hot `labels` or padded positive ids, not soft targets"):
            sharded(features, labels=soft)
        with pytest.raises(ValueError, match="gives no \\[batch, label_count\\] logits: pass `top_k`"):
            sharded(features, return_logits=True)
        with pytest.raises(ValueError, match="no \\[label_count\\] map: gather the layer whole"):
            sharded.label_positions  # noqa: B018
        total = sharded.clip_grad_norm_(0.01)
        expected_total = torch.nn.utils.clip_grad_norm_(layer.output_parameters(), 0.01)
        torch.testing.assert_close(total, expected_total)
        for p, q in zip(sharded.output_parameters(), layer.output_parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        whole = sharded.gather_full(sharded.state_dict())
        assert set(whole) == set(expected_state)
        for name, tensor in expected_state.items():
            assert torch.equal(whole[name], tensor), name
        optimizer = torch.optim.Adam(layer.output_parameters())
        optimizer.step()
        full_state = optimizer.state_dict()
        local = sharded.local_optimizer_state(full_state)
        assert local["param_groups"] == full_state["param_groups"]
        for index, entry in full_state["state"].items():
            for key, value in entry.items():
                assert torch.equal(local["state"][index][key], value), (index, key)
        fewer = {"state": {}, "param_groups": [{"params": [0]}]}
        with pytest.raises(ValueError, match="holds 1 parameters where the model's output layer has"):
            sharded.local_optimizer_state(fewer)


def test_sharding_a_layer_left_on_the_meta_device_without_its_seed_is_refused_naming_deferred_output_rows():
    from haste_hf.training.sharded_output_layer import ShardedOutputLayer

    layer = HasteOutputLayer(16, 30, head_labels=4, group_size=4, fan_in=4)
    layer.head.to("meta"), layer.tail.to("meta")
    with pytest.raises(ValueError, match=r"on the meta device with no initial weight seed: .*deferred_output_rows\(\)"):
        ShardedOutputLayer.shard(layer)


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    """What each collective gave on each of two gloo ranks (tests/distributed_collectives.py)."""
    import distributed_collectives

    output = tmp_path_factory.mktemp("collectives")
    torchrun([str(TESTS / "distributed_collectives.py"), str(output)], output, timeout=300)
    return distributed_collectives, [torch.load(output / f"rank-{rank}.pt", weights_only=False) for rank in range(2)]


def test_sizes_and_rows_of_every_rank_are_gathered_in_rank_order(collectives):
    script, ranks = collectives
    for results in ranks:
        assert results["device"] == torch.device("cpu")
        assert results["sizes"].dtype == torch.int64
        assert results["sizes"].tolist() == [[0, 2**40], [1, 2**40 + 1]]
        for name, counts in (("unequal", script.COUNTS), ("equal", script.EQUAL)):
            expected = torch.cat([script.rows(rank, count) for rank, count in enumerate(counts)])
            assert torch.equal(results[f"gather_{name}"], expected), name


def test_rows_summed_over_ranks_are_scattered_back_to_the_rank_that_holds_them(collectives):
    script, ranks = collectives
    for name, counts in (("unequal", script.COUNTS), ("equal", script.EQUAL)):
        summed = script.rows(0, sum(counts)) + script.rows(1, sum(counts))
        starts = [0, counts[0]]
        for rank, results in enumerate(ranks):
            expected = summed[starts[rank] : starts[rank] + counts[rank]]
            torch.testing.assert_close(results[f"reduce_{name}"], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0, 0.0])
def test_the_gathers_gradient_is_the_sum_over_ranks_times_the_scale_on_each_rows_rank(collectives, scale):
    script, ranks = collectives
    counts, weights = script.COUNTS, script.weights(sum(script.COUNTS))
    expected_rows = torch.cat([script.rows(rank, count) for rank, count in enumerate(counts)])
    starts = [0, counts[0]]
    for rank, results in enumerate(ranks):
        gathered, gradient = results[f"gradient_{scale}"]
        assert torch.equal(gathered, expected_rows)
        expected = 2 * scale * weights[starts[rank] : starts[rank] + counts[rank]]  # two ranks' losses
        torch.testing.assert_close(gradient, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dst", [0, 1])
@pytest.mark.parametrize("chunk_rows, pieces", [(1, 3), (2, 2)])
def test_rows_reach_the_cpu_of_the_destination_rank_alone_in_pieces_of_the_bound(collectives, dst, chunk_rows, pieces):
    script, ranks = collectives
    expected = torch.cat([script.rows(rank, count) for rank, count in enumerate(script.COUNTS)])
    for rank, results in enumerate(ranks):
        full, sent = results[f"to_cpu_{dst}_{chunk_rows}"]
        assert sent == pieces  # the largest share (3 rows) in pieces of `chunk_rows` rows
        if rank == dst:
            assert full.device == torch.device("cpu") and torch.equal(full, expected)
        else:
            assert full is None


@pytest.mark.parametrize("dst", [0, 1])
def test_a_rank_with_fewer_rows_before_the_last_sends_no_padding_into_the_next_ranks_rows(collectives, dst):
    script, ranks = collectives
    expected = torch.cat([script.rows(rank, count) for rank, count in enumerate(script.SHORT_FIRST)])
    full, sent = ranks[dst][f"to_cpu_short_first_{dst}"]
    assert sent == 3 and torch.equal(full, expected)


def test_an_object_reaches_every_rank_from_the_rank_named(collectives):
    _, ranks = collectives
    assert [results["broadcast_from_1"] for results in ranks] == [{"rank": 1}, {"rank": 1}]


def test_a_value_through_a_file_is_written_by_rank_0_read_by_the_others_then_removed(collectives):
    """Rank 0 writes and keeps its own value; the others load it; the file is gone after. A rank that cannot read it,
    or a rank 0 that cannot write it, sends every rank to the broadcast copy."""
    _, ranks = collectives
    for key in ("through_file", "through_file_failing", "through_file_unwritable"):
        assert [results[key] for results in ranks] == [{"rank": 0}, {"rank": 0}], key
    assert ranks[0]["through_file_left"] == []
    assert ranks[0]["calls"] == [("save", 0), ("save", 0)]  # the unwritable folder: no save
    assert ranks[1]["calls"] == [("load", 1), ("load", 1)]


def test_ending_the_group_ends_it_and_without_a_group_is_a_no_op(collectives):
    _, ranks = collectives
    assert [results["ended"] for results in ranks] == [False, False]


def test_parts_below_one_are_refused():
    with pytest.raises(ValueError, match="`parts` must be >= 1, got 0"):
        balanced_ranges(5, 0)
    assert balanced_ranges(5, 1) == [(0, 5)]
    assert balanced_ranges(0, 2) == [(0, 0), (0, 0)]


def test_the_tensor_collectives_are_torchs_current_names_where_it_has_them():
    import torch.distributed as dist

    from haste_hf.training import distributed

    assert distributed._all_gather_single is getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    assert distributed._reduce_scatter_single is getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def test_the_default_group_bound_at_import_is_released_from_torch_distributeds_own_functions(monkeypatch):
    """Only functions of a `torch.distributed` module defined there lose the group as a default, positional or
    keyword; other defaults, other modules' functions and other packages are left as they were."""
    import sys
    import types

    from haste_hf.training.distributed import _release_import_time_references

    group, other = object(), object()

    def make(module_name):
        def collective(tensor, group=group, op=other, *, keyword_group=group, keyword_op=other):
            return group

        collective.__module__ = module_name
        return collective

    own = types.ModuleType("torch.distributed._haste_test")
    own.collective, own.imported = make(own.__name__), make("torch.distributed._elsewhere")
    outside = types.ModuleType("haste_test_outside")
    outside.collective = make(outside.__name__)
    monkeypatch.setitem(sys.modules, own.__name__, own)
    monkeypatch.setitem(sys.modules, outside.__name__, outside)
    monkeypatch.setitem(sys.modules, "torch.distributed._haste_test_missing", None)
    _release_import_time_references(group)
    assert own.collective.__defaults__ == (None, other)
    assert own.collective.__kwdefaults__ == {"keyword_group": None, "keyword_op": other}
    for untouched in (own.imported, outside.collective):
        assert untouched.__defaults__ == (group, other)
        assert untouched.__kwdefaults__ == {"keyword_group": group, "keyword_op": other}


def test_releasing_the_default_group_reads_no_deprecated_name_of_torch_distributed():
    """Ending a run's process group looked at every value of torch.distributed's modules with `isinstance`, which
    reads `__class__` and made the deprecated `reduce_op` print a FutureWarning at the end of every torchrun run."""
    import warnings

    from haste_hf.training.distributed import _release_import_time_references

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _release_import_time_references(object())
    assert [str(warning.message) for warning in caught] == []
