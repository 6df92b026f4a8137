"""`priors`' access to the trained tail labels: gathered for the labels asked alone (issue 37: every tail label's
weights and per-label supports at once held three copies of an 8.6M-label tail while labels were added)."""

import math

import pytest
import torch
from tiny_haste import make_tiny_model

from haste_hf.labels.priors import tail_label_positions, tail_weights_at


def random_layer(generator, **fields):
    """The output layer of a tiny model in eval mode (43 labels, 5 of them in the head, shuffled; `fields` change
    that) with every floating parameter drawn from `generator` (`randomise_`)."""
    settings = dict(label_count=43, head_label_count=5, shuffle_labels=True, training=False)
    layer = make_tiny_model(**{**settings, **fields}).output_layer
    randomise_(layer, generator)
    return layer


def randomise_(module, generator):
    """Every floating parameter of `module` drawn from a standard normal: weights that no start or zeros can mimic."""
    with torch.no_grad():
        for parameter in module.parameters():
            if parameter.is_floating_point():
                parameter.normal_(generator=generator)


def calibration_texts(layer, count, generator):
    """What `calibrate_new_labels` takes beside the labels: embedded texts (`count` new labels' texts, 30 reference
    texts, then one text of each of the layer's 43 trained labels), their head and tail features, and the
    reference's (rows, fit rows, fit label ids)."""
    from haste_hf.labels.additions import branch_features

    embedded = torch.randn(count + 30 + 43, layer.head.weight.shape[1], generator=generator)
    features = {branch: branch_features(layer, embedded, branch) for branch in ("head", "tail")}
    reference = (torch.arange(count, count + 30), torch.arange(count + 30, count + 73), torch.arange(43))
    return embedded, features, reference


@pytest.mark.parametrize("tail_bias", [False, True])
def test_tail_rows_are_the_per_label_weights_supports_and_biases(tail_bias):
    """On random weights, shuffled labels and a padded last group, the rows asked equal those of every tail label
    expanded per label (what `add_labels` read before), and only they are gathered."""
    layer = random_layer(torch.Generator().manual_seed(0), group_size=4, fan_in=8, tail_bias=tail_bias)
    labels, positions = tail_label_positions(layer)
    tail_ids = layer.output_labels[layer.tail_first_position :]
    valid = tail_ids >= 0
    assert torch.equal(labels, tail_ids[valid]) and labels.numel() == 38  # the padding of the last group left out
    every_weight = layer.tail.weight.float().flatten(0, 1)[valid]
    every_support = layer.tail.supports.long().repeat_interleave(layer.group_size, dim=0)[valid]
    rows = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(1))[:9]
    weights, supports, bias = tail_weights_at(layer, positions[rows])
    assert weights.shape == supports.shape == (9, 8) and supports.dtype == torch.int64
    assert torch.equal(weights, every_weight[rows]) and torch.equal(supports, every_support[rows])
    if tail_bias:
        assert torch.equal(bias, layer.tail.bias.float()[valid][rows])
    else:
        assert bias is None


def test_the_tail_map_is_distilled_on_the_reference_from_eight_trained_labels_on():
    """`mapped_weights` of the tail: with the reference texts' tail inputs and at least 8 trained tail labels to
    learn from, the scale is one of `SCALES` (distilled on the reference, a quarter of the labels held out); with
    fewer, or with no reference, the trained labels' norm alone sets it and the reference changes nothing."""
    from haste_hf.labels.priors import BLENDS, SCALES, mapped_weights

    model = make_tiny_model(label_count=43, head_label_count=5, shuffle_labels=True, training=False)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    width = layer.head.weight.shape[1]
    new_x = torch.randn(3, width, generator=generator)
    reference = torch.randn(20, layer.tail.in_features, generator=generator)
    tail_ids, _ = tail_label_positions(layer)
    for trained in (5, 7, 8, 16):
        label_ids = tail_ids[:trained]
        label_x = torch.randn(trained, width, generator=generator)
        plain = mapped_weights(layer, "tail", new_x, label_x, label_ids)
        distilled = mapped_weights(layer, "tail", new_x, label_x, label_ids, reference, BLENDS)
        assert plain.scale not in SCALES
        if trained < 8:
            assert torch.equal(distilled.weights, plain.weights) and distilled.scale == plain.scale, trained
        else:
            assert distilled.scale in SCALES, trained


def test_a_head_row_is_mapped_from_every_trained_label_where_the_branches_share_features():
    """Every trained label's weights are a linear function of its text; the head holds 3 of 83 labels. A head row
    mapped for new texts recovers that function from the tail labels too (their F weights scattered onto the
    features), which the 3 head labels alone cannot (issue 36: deps' text map from the head labels alone)."""
    from tiny_encoders import HIDDEN

    from haste_hf.labels.priors import head_map_targets, mapped_weights

    model = make_tiny_model(label_count=83, head_label_count=3, group_size=4, fan_in=HIDDEN, shuffle_labels=True)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    label_x = torch.randn(83, HIDDEN, generator=generator)
    truth = torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN**0.5
    dense = label_x @ truth
    labels, positions = tail_label_positions(layer)
    head_ids = layer.output_labels[: layer.head_label_count]
    with torch.no_grad():
        layer.head.weight.copy_(dense[head_ids])
        layer.head.bias.zero_()
        supports = layer.tail.supports.long()[positions // layer.group_size]
        layer.tail.weight.flatten(0, 1)[positions] = dense[labels].gather(1, supports)
    ids = torch.arange(83)
    rows, targets = head_map_targets(layer, ids, layer.label_positions[ids])
    assert bool(rows.all()) and targets.shape == (83, HIDDEN + 1)
    torch.testing.assert_close(targets[:, :HIDDEN], dense)
    new_x = torch.randn(5, HIDDEN, generator=generator)
    start = mapped_weights(layer, "head", new_x, label_x, ids)
    error = (start.weights - new_x @ truth).norm() / (new_x @ truth).norm()
    assert error < 0.1, error


@pytest.mark.parametrize("biases", [False, True])
@pytest.mark.parametrize("negatives", [0, 2])
def test_without_a_map_a_new_label_starts_at_its_texts_mean_direction_and_the_trained_weights_norm(biases, negatives):
    """`fallback_start` (no label names to map from): each new label's direction is the mean of its positive rows,
    less the negatives' mean where there are negatives; the head gets unit directions times the head rows' mean norm,
    the tail its directions with the tail labels' mean norm (the padding of the last group left out) for
    `on_supports`; the bias is the trained biases' mean, or none where the branch has none."""
    from haste_hf.labels.priors import fallback_start

    layer = random_layer(torch.Generator().manual_seed(0), group_size=4, fan_in=8, tail_bias=biases)
    if not biases:
        layer.head.bias = None
    generator = torch.Generator().manual_seed(1)
    pairs = (torch.tensor([0, 1, 2, 3, 4]), torch.tensor([0, 1, 1, 2, 2]))
    negative_rows = torch.arange(5, 5 + negatives)
    tail_ids = layer.output_labels[layer.tail_first_position :]
    tail_norms = layer.tail.weight.flatten(0, 1)[tail_ids >= 0].norm(dim=1)
    for branch, width in (("head", layer.head.in_features), ("tail", layer.tail.in_features)):
        x = torch.randn(7, width, generator=generator)
        direction = torch.stack([x[0], x[1:3].mean(dim=0), x[3:5].mean(dim=0)])
        if negatives:
            direction = direction - x[5:7].mean(dim=0)
        with torch.no_grad():  # as `add_labels` calls it
            start = fallback_start(layer, branch, x, pairs, negative_rows, 3)
        if branch == "head":
            expected = direction / direction.norm(dim=1, keepdim=True) * layer.head.weight.norm(dim=1).mean()
            torch.testing.assert_close(start.weights, expected)
            assert start.norm is None and start.scale == 1.0
            trained_bias = layer.head.bias
        else:
            torch.testing.assert_close(start.weights, direction)
            assert start.norm == pytest.approx(tail_norms.mean().item(), rel=1e-6)
            trained_bias = layer.tail.bias[tail_ids >= 0] if biases else None
        if biases:
            torch.testing.assert_close(start.bias, trained_bias.mean().expand(3))
        else:
            assert start.bias is None, branch


def test_starting_weights_on_supports_are_scaled_or_set_to_the_norm():
    """`StartingWeights.on_supports`: the dense vectors' values on each label's support, times `scale`; with a
    `norm`, each label's values rescaled to that norm (the fallback's tail start)."""
    from haste_hf.labels.priors import StartingWeights

    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(3, 16, generator=generator)
    supports = torch.stack([torch.randperm(16, generator=generator)[:4] for _ in range(3)])
    on_support = weights.gather(1, supports)
    torch.testing.assert_close(StartingWeights(weights, None, scale=0.5).on_supports(supports), 0.5 * on_support)
    normed = StartingWeights(weights, None, norm=2.5).on_supports(supports)
    torch.testing.assert_close(normed.norm(dim=1), torch.full((3,), 2.5))
    torch.testing.assert_close(
        normed / normed.norm(dim=1, keepdim=True), on_support / on_support.norm(dim=1, keepdim=True)
    )


def test_the_map_is_fitted_on_every_trained_label_or_on_a_seeded_draw_past_its_limit():
    """`map_labels`: every label id up to `MAX_MAP_LABELS` labels; past it, `MAX_MAP_LABELS` distinct ids in order,
    the same for a seed and another for another seed."""
    from haste_hf.labels.priors import MAX_MAP_LABELS, map_labels

    assert torch.equal(map_labels(MAX_MAP_LABELS, 0), torch.arange(MAX_MAP_LABELS))
    drawn = map_labels(MAX_MAP_LABELS + 7, 0)
    assert drawn.shape == (MAX_MAP_LABELS,) and bool((drawn[1:] > drawn[:-1]).all())
    assert int(drawn[0]) >= 0 and int(drawn[-1]) < MAX_MAP_LABELS + 7
    assert torch.equal(map_labels(MAX_MAP_LABELS + 7, 0), drawn)
    assert not torch.equal(map_labels(MAX_MAP_LABELS + 7, 1), drawn)


def test_a_head_row_adds_the_copy_of_its_text_at_the_weight_given():
    """`mapped_weights` of the head with `blends` `(w,)`: the ridge map's prediction plus `w` times the text's own
    head inputs less the trained texts' mean, scaled to the prediction's spread (issue 36: on deps, seed 0, the copy
    at 0.5 lifted held-out R@5 of the map alone); `(0.0,)` is the map alone."""
    from tiny_encoders import HIDDEN

    from haste_hf.labels.priors import RidgeFitter, head_map_targets, mapped_weights

    generator = torch.Generator().manual_seed(0)
    layer = random_layer(generator, label_count=83, head_label_count=3, fan_in=HIDDEN, shuffle_labels=False)
    label_x = torch.randn(83, HIDDEN, generator=generator)
    new_x = torch.randn(5, HIDDEN, generator=generator)
    ids = torch.arange(83)
    _, targets = head_map_targets(layer, ids, layer.label_positions[ids])
    text_map = RidgeFitter(label_x).fit(targets)
    mapped = text_map(new_x).float()[:, :HIDDEN]
    plain = mapped_weights(layer, "head", new_x, label_x, ids, blends=(0.0,))
    torch.testing.assert_close(plain.weights, mapped)
    spread = (mapped - text_map.target_mean[:HIDDEN].float()).norm(dim=1).mean()
    copy = new_x - label_x.mean(dim=0)
    expected = mapped + 0.5 * copy * spread / copy.norm(dim=1).mean()
    torch.testing.assert_close(mapped_weights(layer, "head", new_x, label_x, ids, blends=(0.5,)).weights, expected)
    torch.testing.assert_close(plain.bias, text_map(new_x).float()[:, HIDDEN])


def test_a_head_label_keeps_a_damped_part_of_its_neighbours_level(monkeypatch):
    """`calibrate_new_labels`: a new head label's mass on the reference is the trained labels' mean log
    false-positive mass plus `HEAD_LEVEL_SPREAD` of its nearest trained labels' distance from it (issue 36: the
    neighbours' level, noisy, reordered the new head labels among themselves); a tail label keeps its neighbours'.
    The level alone: the rank cap, which may lower it after (`test_rank_caps.py`), is off."""
    import math

    from haste_hf.labels import priors
    from haste_hf.labels.additions import NewLabelWeights, place_new_labels

    generator = torch.Generator().manual_seed(0)
    layer = random_layer(generator)
    count = 6
    embedded, features, (rows, fit_rows, fit_ids) = calibration_texts(layer, count, generator)
    floor = math.exp(priors.log_mass_floor(30))
    _, false_positive = (values.clamp(min=floor).log() for values in priors.label_masses(layer, embedded[rows]))
    nearest = priors.nearest_log_masses(embedded[fit_rows], false_positive, embedded[:count])
    common = false_positive.mean()
    directions = torch.randn(count, layer.tail.in_features, generator=generator)
    monkeypatch.setattr(priors, "rank_caps", lambda scores, *_: torch.zeros(scores.shape[1], dtype=torch.float64))
    for head, expected in ((True, common + priors.HEAD_LEVEL_SPREAD * (nearest - common)), (False, nearest)):
        weights = NewLabelWeights(layer, place_new_labels(layer, count, None if head else directions, 0), count)
        randomise_(weights, generator)
        priors.calibrate_new_labels(layer, weights, embedded, features, (rows, fit_rows, fit_ids))
        scores = weights.logits(features["head"][rows], features["tail"][rows]).double()
        torch.testing.assert_close(torch.sigmoid(scores).sum(dim=0).log(), expected.double(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("head", [True, False])
def test_new_labels_are_calibrated_a_chunk_at_a_time(head, monkeypatch):
    """`calibrate_new_labels` scores a bounded chunk of new labels at a time (`logits_of`, never every label's
    scores on the reference at once: 16 GB at 10^6 new labels) and gives the offsets of one pass over all of them,
    with examples spread over the chunks and labels without examples among them (issue 36)."""
    from haste_hf.labels import priors
    from haste_hf.labels.additions import NewLabelWeights, place_new_labels

    generator = torch.Generator().manual_seed(0)
    layer = random_layer(generator)
    count = 7
    embedded, features, reference = calibration_texts(layer, count, generator)
    examples = (torch.tensor([count + 3, count + 9, count + 1, count + 4, count + 12]), torch.tensor([5, 0, 5, 2, 6]))
    directions = None if head else torch.randn(count, layer.tail.in_features, generator=generator)
    weights = NewLabelWeights(layer, place_new_labels(layer, count, directions, 0), count)
    randomise_(weights, generator)
    start = {name: value.detach().clone() for name, value in weights.state_dict().items()}
    every = weights.logits(features["head"], features["tail"])
    picked = torch.tensor([6, 0, 3])
    torch.testing.assert_close(weights.logits_of(features["head"], features["tail"], picked), every[:, picked])

    def offsets_with(chunk):
        weights.load_state_dict(start)
        monkeypatch.setattr(priors, "LABEL_CHUNK", chunk)
        priors.calibrate_new_labels(layer, weights, embedded, features, reference, examples)
        return torch.cat([(value - start[name]).flatten() for name, value in weights.state_dict().items()])

    whole = offsets_with(8192)
    scored = []
    original = NewLabelWeights.logits_of

    def spy(self, head_x, tail_x, labels):
        scored.append(labels.numel())
        return original(self, head_x, tail_x, labels)

    monkeypatch.setattr(NewLabelWeights, "logits", lambda *_: pytest.fail("every new label scored at once"))
    monkeypatch.setattr(NewLabelWeights, "logits_of", spy)
    torch.testing.assert_close(offsets_with(2), whole, atol=1e-5, rtol=0)
    assert scored == [2, 2, 2, 1] and whole.abs().sum() > 0


def test_the_tail_maps_scale_is_distilled_on_a_quarter_of_the_labels_held_out_of_its_fit(monkeypatch):
    """`distilled_blend`: the labels its second map is scored on (a quarter, up to `SCALE_LABELS`) are kept out of
    that map's fit, and every other trained label is in it."""
    from haste_hf.labels import priors

    fitted, predicted = [], []
    real_fitter, real_blended_map = priors.RidgeFitter, priors.blended_map

    def fitter(inputs):
        fitted.append(inputs.clone())
        return real_fitter(inputs)

    def blended_map(*args):
        predict = real_blended_map(*args)
        return lambda texts, copies: (predicted.append(texts.clone()), predict(texts, copies))[1]

    monkeypatch.setattr(priors, "RidgeFitter", fitter)
    monkeypatch.setattr(priors, "blended_map", blended_map)
    model = make_tiny_model(label_count=43, head_label_count=5, shuffle_labels=True, training=False)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    width = layer.head.weight.shape[1]
    for trained, held in ((16, 4), (23, 5)):
        fitted.clear(), predicted.clear()
        label_x = torch.randn(trained, width, generator=generator)
        reference = torch.randn(20, layer.tail.in_features, generator=generator)
        new_x = torch.randn(3, width, generator=generator)
        label_ids = tail_label_positions(layer)[0][:trained]
        priors.mapped_weights(layer, "tail", new_x, label_x, label_ids, reference, priors.BLENDS)
        fit_rows = {tuple(row.tolist()) for row in fitted[0]}  # the distillation's map, then the final one
        held_rows = {tuple(row.tolist()) for row in predicted[0]}
        assert len(fitted[0]) == trained - held and len(predicted[0]) == held, trained
        assert not fit_rows & held_rows and fit_rows | held_rows == {tuple(row.tolist()) for row in label_x}
        assert len(fitted[-1]) == trained and torch.equal(predicted[-1], new_x)  # the final map: every label


def test_the_floor_of_a_log_mass_divides_by_the_reference_count_and_takes_no_reference():
    from haste_hf.labels.priors import log_mass_floor

    assert log_mass_floor(10) == pytest.approx(math.log(1e-4)) and log_mass_floor(1) == pytest.approx(math.log(1e-3))
    assert log_mass_floor(0) == pytest.approx(math.log(1e-3))  # no reference texts: the floor of one


def test_label_masses_of_a_bfloat16_layer_score_float32_reference_features_in_its_dtype():
    """`label_masses` gives the layer its inputs in the dtype of its weights (`_input_dtype`): a bf16 layer scores
    float32 features as their bf16 rounding, whichever module reads its inputs first."""
    from haste_hf.labels.priors import _input_dtype, label_masses

    for fields in ({}, {"head_label_count": 0}, {"tail_projection_dim": 16, "head_projection_dim": 8}):
        layer = make_tiny_model(label_count=43, training=False, **fields).output_layer.to(torch.bfloat16)
        assert _input_dtype(layer) == torch.bfloat16
        reference = torch.randn(6, layer.in_features, generator=torch.Generator().manual_seed(0))
        mass, false_mass = label_masses(layer, reference)
        probabilities = torch.sigmoid(layer.logits(reference.to(torch.bfloat16)).float()).double()
        torch.testing.assert_close(mass, probabilities.sum(dim=0))
        torch.testing.assert_close(false_mass, (probabilities * (1 - probabilities)).sum(dim=0))


def test_a_head_map_is_fitted_from_two_trained_head_labels_and_none_from_one():
    """Where the head reads its own features (a projection), only head labels teach its map: two are enough for a
    ridge map, one is not (`mapped_weights` gives None, and the caller falls back to the texts' directions)."""
    from haste_hf.labels.priors import mapped_weights

    model = make_tiny_model(label_count=43, head_label_count=5, head_projection_dim=8, training=False)
    layer = model.output_layer
    generator = torch.Generator().manual_seed(0)
    head_ids = layer.output_labels[: layer.head_label_count]
    tail_ids = tail_label_positions(layer)[0][:6]
    new_x = torch.randn(3, layer.in_features, generator=generator)
    for head_count in (0, 1, 2, 3):
        label_ids = torch.cat([head_ids[:head_count], tail_ids])
        label_x = torch.randn(label_ids.numel(), layer.in_features, generator=generator)
        start = mapped_weights(layer, "head", new_x, label_x, label_ids)
        if head_count < 2:
            assert start is None, head_count
        else:
            assert start.weights.shape == (3, 8) and bool(start.weights.isfinite().all()), head_count
