"""The output layer's initial rows, block by block: any share of them equals the same rows of the whole layer."""

import pytest
import torch
from tiny_haste import make_tiny_model

from haste_hf.modeling import initialization
from haste_hf.modeling.initialization import (
    block_seed,
    deferred_output_rows,
    initialize_output_rows_,
    output_rows_on,
    random_supports,
)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 5 rows, so that a tiny layer's shares start and end inside blocks."""
    monkeypatch.setattr(initialization, "INITIAL_BLOCK_ROWS", 5)


def test_supports_of_a_range_of_groups_are_those_groups_of_all(small_blocks):
    whole = random_supports(23, 4, 16, seed=7)
    assert whole.dtype == torch.int32 and whole.shape == (23, 4)
    assert all(row.unique().numel() == 4 for row in whole) and int(whole.min()) >= 0 and int(whole.max()) < 16
    for first, count in [(0, 3), (3, 9), (12, 11), (22, 1), (5, 0)]:
        assert torch.equal(random_supports(count, 4, 16, seed=7, first_group=first), whole[first : first + count])
    assert not torch.equal(random_supports(23, 4, 16, seed=8), whole)


def test_block_seeds_differ_between_seeds_streams_and_blocks():
    seeds = {block_seed(seed, stream, block) for seed in range(4) for stream in range(3) for block in range(50)}
    assert len(seeds) == 4 * 3 * 50 and all(0 <= seed < 2**63 for seed in seeds)


def test_a_deferred_model_is_the_same_model_with_its_rows_left_to_build(small_blocks):
    """Built within `deferred_output_rows`, the head and tail are on the meta device and everything else equals the
    model built whole (torch's generator is drawn alike); rows built for any share equal those rows of the whole."""
    fields = dict(label_count=90, head_label_count=13, seed=3, tail_bias=True)
    whole = make_tiny_model(**fields)
    after_whole = torch.rand(3)
    with deferred_output_rows():
        deferred = make_tiny_model(**fields)
    assert torch.equal(torch.rand(3), after_whole)  # the same draws, so the same dropout and data order after it
    layer, reference = deferred.output_layer, whole.output_layer
    assert layer.head.weight.is_meta and layer.tail.weight.is_meta and layer.tail.supports.is_meta
    assert layer.initial_weight_seed == reference.initial_weight_seed
    for name, value in whole.state_dict().items():
        if not deferred.state_dict()[name].is_meta:
            assert torch.equal(deferred.state_dict()[name], value), name
    assert float(reference.head.weight.detach().std()) == pytest.approx(0.02, rel=0.3)  # transformers' N(0, 0.02)
    bound = 1 / reference.tail.weight.shape[-1] ** 0.5
    assert bound / 2 < float(reference.tail.weight.detach().abs().max()) <= bound
    for head_rows, tail_groups in [((0, 6), (0, 11)), ((6, 13), (11, 20)), ((2, 3), (4, 17))]:
        share = make_share(layer, head_rows, tail_groups)
        initialize_output_rows_(share, layer.initial_weight_seed, layer.initial_head_std)
        assert torch.equal(share.head.weight, reference.head.weight[slice(*head_rows)])
        assert torch.equal(share.head.bias, torch.zeros(head_rows[1] - head_rows[0]))
        assert torch.equal(share.tail.weight, reference.tail.weight[slice(*tail_groups)])
        assert torch.equal(share.tail.supports, reference.tail.supports[slice(*tail_groups)])
        assert torch.equal(share.tail.bias, torch.zeros((tail_groups[1] - tail_groups[0]) * 4))


def test_rows_built_in_their_dtype_are_the_rows_built_in_fp32_then_cast(small_blocks):
    """Within `output_rows_on`, the head and tail are born in the dtype asked for (a 10^8-label tail is not held whole
    in fp32 first), with the values of the fp32 build cast, and everything else as the fp32 build."""
    fields = dict(label_count=90, head_label_count=13, seed=3, tail_bias=True)
    whole = make_tiny_model(**fields)
    with output_rows_on("cpu", torch.bfloat16):
        built = make_tiny_model(**fields)
    layer, reference = built.output_layer, whole.output_layer
    for module, fp32 in ((layer.head, reference.head), (layer.tail, reference.tail)):
        assert module.weight.dtype == module.bias.dtype == torch.bfloat16
        assert torch.equal(module.weight, fp32.weight.to(torch.bfloat16)) and not module.bias.any()
    assert torch.equal(layer.tail.supports, reference.tail.supports) and layer.tail.supports.dtype == torch.int32
    assert torch.equal(layer.output_labels, reference.output_labels)
    assert torch.equal(built.encoder.embeddings.word_embeddings.weight, whole.encoder.embeddings.word_embeddings.weight)


def test_supports_are_drawn_into_the_tensor_given(small_blocks):
    out = torch.full((9, 4), -1, dtype=torch.int32)
    assert random_supports(9, 4, 16, seed=7, first_group=3, out=out) is out
    assert torch.equal(out, random_supports(23, 4, 16, seed=7)[3:12])


def test_loaded_and_meta_tensors_are_left_alone():
    model = make_tiny_model(label_count=30, head_label_count=4)
    layer = model.output_layer
    layer.head.weight._is_hf_initialized = True
    kept, before = layer.head.weight.detach().clone(), layer.tail.weight.detach().clone()
    initialize_output_rows_(layer, layer.initial_weight_seed + 1, 0.02)
    assert torch.equal(layer.head.weight, kept) and not torch.equal(layer.tail.weight, before)


def make_share(layer, head_rows, tail_groups):
    """A stand-in of a rank's share: the layer's settings, empty tensors of the share's rows."""
    share = torch.nn.Module()
    share.head_rows, share.tail_groups, share.supports_seed = head_rows, tail_groups, layer.supports_seed
    rows, groups = head_rows[1] - head_rows[0], tail_groups[1] - tail_groups[0]
    share.head = torch.nn.Linear(layer.head.in_features, rows)
    share.tail = type(layer.tail)(layer.tail.in_features, groups, layer.group_size, layer.fan_in, bias=True)
    return share


def test_rows_do_not_depend_on_the_threads_that_draw_them(small_blocks, monkeypatch):
    drawn = []
    for threads in (1, 3):
        monkeypatch.setattr(initialization, "build_threads", lambda threads=threads: threads)
        drawn.append(random_supports(37, 4, 16, seed=2, first_group=3))
    assert torch.equal(drawn[0], drawn[1])
