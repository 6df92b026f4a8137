import math
import random
from fractions import Fraction

import pytest
import torch

from haste_hf.modeling.rewiring import (
    group_slot_scores,
    num_pairs_to_prune,
    reset_optimizer_state_,
    rewire_,
    rewiring_seed,
)
from haste_hf.training.optimization import HasteOptimizer, StochasticRoundingSGD


def random_supports(groups, fan_in, features, generator):
    return torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)]).int()


def reference_scores(weight, label_mask):
    """Mean |w| over valid labels, one (group, slot) at a time, in float64."""
    groups, group_size, fan_in = weight.shape
    scores = torch.empty(groups, fan_in, dtype=torch.float64)
    for k in range(groups):
        valid = [g for g in range(group_size) if label_mask is None or label_mask[k, g]]
        for j in range(fan_in):
            scores[k, j] = sum(abs(float(weight[k, g, j])) for g in valid) / len(valid)
    return scores


def random_case(rng: random.Random, generator):
    groups, group_size, fan_in = rng.randint(1, 12), rng.randint(1, 4), rng.randint(1, 8)
    features = fan_in + rng.choice([1, 2, 5, 20])  # includes pools with a single free feature
    weight = torch.randn(groups, group_size, fan_in, generator=generator)
    supports = random_supports(groups, fan_in, features, generator)
    label_mask = None
    if rng.random() < 0.5:
        label_mask = torch.ones(groups, group_size, dtype=torch.bool)
        label_mask[-1, rng.randint(1, group_size) :] = False  # padding labels of the last group
        weight[-1][~label_mask[-1]] = 100.0  # would protect every slot of the last group if scored
    return weight, supports, features, label_mask


def test_invariants_over_many_random_rewirings():
    rng = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    for case in range(200):
        weight, supports, features, label_mask = random_case(rng, generator)
        groups, _, fan_in = weight.shape
        fraction = Fraction(rng.randint(0, 100), 100)
        scope, init = rng.choice(["global", "group"]), rng.choice(["zero", "random"])
        weight_before, supports_before = weight.clone(), supports.clone()

        result = rewire_(
            weight, supports, features, float(fraction), scope, init, seed=case, step=7, label_mask=label_mask
        )

        # supports: distinct, in range, changed exactly at the rewired pairs, never back to the old index
        assert supports.dtype == torch.int32
        assert int(supports.min()) >= 0 and int(supports.max()) < features
        assert all(len(set(row.tolist())) == fan_in for row in supports)
        mask = result.mask
        assert torch.equal(supports[~mask], supports_before[~mask])
        assert torch.equal(supports[mask], result.new_features)
        assert torch.equal(supports_before[mask], result.old_features)
        assert bool((result.new_features != result.old_features).all())

        # count
        expected = (
            math.floor(groups * fan_in * fraction) if scope == "global" else groups * math.floor(fan_in * fraction)
        )
        assert result.count == expected == int(mask.sum())

        # the weakest pairs were chosen (any order among ties)
        scores = reference_scores(weight_before, label_mask)
        assert torch.allclose(group_slot_scores(weight_before, label_mask).double(), scores, rtol=1e-6)
        if scope == "global" and 0 < result.count < groups * fan_in:
            assert scores[mask].max() <= scores[~mask].min() + 1e-6
        if scope == "group":
            for k in range(groups):
                if 0 < int(mask[k].sum()) < fan_in:
                    assert scores[k][mask[k]].max() <= scores[k][~mask[k]].min() + 1e-6

        # weights: rewired slots reset for every label, all others untouched
        kept = ~mask.unsqueeze(1).expand_as(weight)
        assert torch.equal(weight[kept], weight_before[kept])
        reset = weight.permute(0, 2, 1)[mask]  # [count, G]
        if init == "zero":
            assert bool((reset == 0).all())
        else:
            assert bool((reset.abs() <= 1 / math.sqrt(fan_in)).all())
            assert reset.numel() == 0 or bool((reset != 0).any())


def test_same_seed_and_step_rewire_identically_other_steps_differ():
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(50, 4, 8, generator=generator)
    supports = random_supports(50, 8, 40, generator)

    def run(seed, step):
        w, s = weight.clone(), supports.clone()
        rewire_(w, s, 40, 0.25, init="random", seed=seed, step=step)
        return w, s

    first, again = run(3, 100), run(3, 100)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], run(3, 200)[1])
    assert not torch.equal(first[1], run(4, 100)[1])
    assert rewiring_seed(3, 100) == rewiring_seed(3, 100) != rewiring_seed(3, 101)


def test_pairs_to_prune_is_the_exact_floor_of_the_product():
    # 100 * 0.29 is 28.999999999999996 in binary floating point.
    assert num_pairs_to_prune(100, 0.29) == 29
    assert num_pairs_to_prune(100, 0.57) == 57 and num_pairs_to_prune(10, 0.35) == 3 and num_pairs_to_prune(7, 1.0) == 7


def test_ties_go_to_the_lowest_group_and_slot():
    weight = torch.ones(3, 2, 4)
    supports = torch.arange(4, dtype=torch.int32).repeat(3, 1)
    result = rewire_(weight, supports, 10, 0.5)
    assert result.groups.tolist() == [0, 0, 0, 0, 1, 1]
    assert result.slots.tolist() == [0, 1, 2, 3, 0, 1]


def test_a_single_free_feature_and_full_pruning_still_terminate():
    generator = torch.Generator().manual_seed(2)
    supports = random_supports(30, 15, 16, generator)
    before = supports.clone()
    result = rewire_(torch.randn(30, 2, 15), supports, 16, 1.0)
    assert result.count == 30 * 15
    assert all(len(set(row.tolist())) == 15 for row in supports)
    assert bool((supports != before).all())


def test_label_mask_keeps_padding_labels_out_of_the_scores():
    weight = torch.full((2, 2, 3), 1.0)
    weight[1, 0, 0] = 0.1  # group 1, slot 0 is the weakest for its only real label ...
    weight[1, 1, 0] = 50.0  # ... but a padding label holds a large weight there
    supports = torch.tensor([[0, 1, 2], [0, 1, 2]], dtype=torch.int32)
    label_mask = torch.tensor([[True, True], [True, False]])
    unmasked = rewire_(weight.clone(), supports.clone(), 8, 1 / 6)
    masked = rewire_(weight.clone(), supports.clone(), 8, 1 / 6, label_mask=label_mask)
    assert (unmasked.groups.tolist(), unmasked.slots.tolist()) == ([0], [0])
    assert (masked.groups.tolist(), masked.slots.tolist()) == ([1], [0])


def test_bad_inputs_raise_clear_errors():
    weight, supports = torch.randn(2, 2, 4), torch.arange(4, dtype=torch.int32).repeat(2, 1)
    with pytest.raises(ValueError, match="fan_in F=4 equals num_features"):
        rewire_(weight, supports.clone(), 4, 0.5)
    assert rewire_(weight, supports.clone(), 4, 0.0).count == 0
    with pytest.raises(ValueError, match="outside"):
        rewire_(weight, supports.clone(), 3, 0.5)
    with pytest.raises(ValueError, match="fraction"):
        rewire_(weight, supports.clone(), 8, 1.5)
    with pytest.raises(ValueError, match="scope"):
        rewire_(weight, supports.clone(), 8, 0.5, scope="layer")
    with pytest.raises(ValueError, match="init"):
        rewire_(weight, supports.clone(), 8, 0.5, init="normal")
    with pytest.raises(ValueError, match="supports"):
        rewire_(weight, supports[:, :3].clone(), 8, 0.5)
    with pytest.raises(ValueError, match="no valid label in group 1"):
        rewire_(weight, supports.clone(), 8, 0.5, label_mask=torch.tensor([[True, True], [False, False]]))


def stepped(optimizer, weight):
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    return optimizer


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda w: torch.optim.SGD([w], lr=0.1, momentum=0.9),
        lambda w: torch.optim.AdamW([w], lr=0.1),
        lambda w: StochasticRoundingSGD([w], lr=0.1, momentum=0.9),
        lambda w: HasteOptimizer(
            torch.optim.AdamW([torch.nn.Parameter(torch.ones(2))]), StochasticRoundingSGD([w], momentum=0.9)
        ),
    ],
    ids=["sgd", "adamw", "stochastic-rounding-sgd", "haste-optimizer"],
)
def test_optimizer_state_of_exactly_the_rewired_slots_is_zeroed(make_optimizer):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(6, 3, 5))
    supports = random_supports(6, 5, 12, torch.Generator().manual_seed(0))
    optimizer = stepped(make_optimizer(weight), weight)
    state_before = {key: value.clone() for key, value in optimizer.state[weight].items() if torch.is_tensor(value)}
    result = rewire_(weight.data, supports, 12, 0.3, seed=1, step=1)
    assert reset_optimizer_state_(optimizer, weight, result) >= 1
    rewired = result.mask.unsqueeze(1).expand_as(weight)
    for key, before in state_before.items():
        after = optimizer.state[weight][key]
        if after.shape == weight.shape:
            assert bool((after[rewired] == 0).all()), key
            assert torch.equal(after[~rewired], before[~rewired]), key
        else:
            assert torch.equal(after, before), key  # e.g. Adam's `step`


def test_optimizer_state_reset_accepts_a_mask_and_checks_the_parameter():
    weight = torch.nn.Parameter(torch.randn(3, 2, 4))  # K, G, F all differ: a mask [K, F] is told from [G, F]
    optimizer = stepped(torch.optim.SGD([weight], lr=0.1, momentum=0.9), weight)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[1, 2] = True
    reset_optimizer_state_(optimizer, weight, mask)
    buffer = optimizer.state[weight]["momentum_buffer"]
    assert bool((buffer[1, :, 2] == 0).all()) and int((buffer == 0).sum()) == 2
    for bad in (torch.zeros(2, 4, dtype=torch.bool), torch.zeros(3, 2, dtype=torch.bool), mask.int()):
        with pytest.raises(ValueError, match=r"`rewired` must be a RewiringResult or a bool mask \[groups, fan_in\]"):
            reset_optimizer_state_(optimizer, weight, bad)
    with pytest.raises(ValueError, match="not among the parameters"):
        reset_optimizer_state_(optimizer, torch.nn.Parameter(torch.randn(3, 2, 4)), mask)
    assert reset_optimizer_state_(torch.optim.SGD([weight], lr=0.1, momentum=0.9), weight, mask) == 0  # no state yet


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rewiring_matches_cpu_and_keeps_the_invariants():
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(2000, 8, 16, generator=generator)  # distinct scores: no tie for rounding to flip
    supports = random_supports(2000, 16, 48, generator)
    label_mask = torch.ones(2000, 8, dtype=torch.bool)
    label_mask[-1, 5:] = False
    results = {}
    for device in ("cpu", "cuda"):
        w, s = weight.clone().to(device), supports.clone().to(device)
        result = rewire_(w, s, 48, 0.2, init="random", seed=2, step=9, label_mask=label_mask.to(device))
        results[device] = (w.cpu(), s.cpu(), result.mask.cpu())
        assert result.groups.device.type == device
    assert all(torch.equal(a, b) for a, b in zip(results["cpu"], results["cuda"]))
    assert all(len(set(row.tolist())) == 16 for row in results["cuda"][1])


def test_label_normalized_scores_match_their_definition():
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(5, 4, 6, generator=generator)
    weight[2, 1] = 0  # an all-zero label counts zero, not NaN
    label_mask = torch.ones(5, 4, dtype=torch.bool)
    label_mask[-1, 2:] = False
    relative = weight.abs().double() / weight.abs().double().mean(dim=2, keepdim=True).clamp_min(1e-300)
    torch.testing.assert_close(
        group_slot_scores(weight, label_mask, "label_normalized").double(), reference_scores(relative, label_mask)
    )
    torch.testing.assert_close(group_slot_scores(weight, label_mask), reference_scores(weight, label_mask).float())


def test_label_normalized_scores_give_a_rare_label_its_say_in_the_support():
    """One group: a frequent label with large weights (slot 1 its weakest but one), a rare label whose small weights
    peak in slot 1. Mean |w| prunes slot 1, the rare label's only strong slot; normalised per label, slot 0 (weak for
    both, relatively) goes."""
    weight = torch.tensor([[[1.0, 0.6, 2.0, 2.0], [0.02, 0.2, 0.02, 0.02]]])
    supports = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    plain = rewire_(weight.clone(), supports.clone(), 8, 0.25)
    normalized = rewire_(weight.clone(), supports.clone(), 8, 0.25, score="label_normalized")
    assert plain.slots.tolist() == [1]
    assert normalized.slots.tolist() == [0]
    with pytest.raises(ValueError, match="score"):
        rewire_(weight.clone(), supports.clone(), 8, 0.25, score="max")
