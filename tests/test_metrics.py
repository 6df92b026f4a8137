import math

import napkinxc.metrics as napkin
import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from haste_hf.data import pad_label_ids
from haste_hf.metrics import (
    Propensity,
    XMCMetric,
    compute_xmc_metrics,
    filter_top_k,
    make_compute_metrics,
    max_filtered_per_point,
    propensity_parameters,
)


D1, D2, D3 = 1.0, 1 / math.log2(3), 0.5  # rank discounts 1/log2(r+1)

# Point 0: y={1,2}, hits at ranks 1 and 3. Point 1: y={4}, no prediction at rank 1, hit at rank 2.
# Point 2: no true labels.
PREDICTIONS = np.array([[2, 5, 1], [-1, 4, 0], [0, 1, 2]])
TRUE = [[1, 2], [4], []]
INVERSE = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # q_l = l + 1


def test_hand_computed_example():
    result = compute_xmc_metrics(PREDICTIONS, TRUE, ks=(1, 3), propensity=Propensity(INVERSE, a=0.55, b=1.5))
    expected = {
        "P@1": 1 / 3,
        "P@3": (2 / 3 + 1 / 3 + 0) / 3,
        "nDCG@1": 1 / 3,
        "nDCG@3": ((D1 + D3) / (D1 + D2) + D2 / D1 + 0) / 3,
        "R@1": (1 / 2) / 3,
        "R@3": (1 + 1 + 0) / 3,
        # q of hits over the best q's of the true labels, summed over points (1/k cancels).
        "PSP@1": (3 + 0) / (3 + 5),
        "PSP@3": (3 + 2 + 5) / (3 + 2 + 5),
        # (PS)DCG divided by each point's unit-gain IDCG, then ratio of sums.
        "PSnDCG@1": (3 / D1 + 0) / (3 / D1 + 5 / D1),
        "PSnDCG@3": ((3 * D1 + 2 * D3) / (D1 + D2) + 5 * D2) / ((3 * D1 + 2 * D2) / (D1 + D2) + 5 * D1),
        "propensity_a": 0.55,
        "propensity_b": 1.5,
    }
    assert result.keys() == expected.keys()
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12), name


def test_points_without_labels_kept_or_dropped():
    kept = compute_xmc_metrics(PREDICTIONS, TRUE, ks=(1, 3), propensity=Propensity(INVERSE, 0.55, 1.5))
    dropped = compute_xmc_metrics(
        PREDICTIONS, TRUE, ks=(1, 3), propensity=Propensity(INVERSE, 0.55, 1.5), drop_empty_points=True
    )
    assert dropped["P@1"] == pytest.approx(1 / 2) and dropped["R@3"] == pytest.approx(1.0)
    for name in ("P@3", "nDCG@3", "R@3"):
        assert dropped[name] == pytest.approx(kept[name] * 3 / 2)
    for name in ("PSP@1", "PSP@3", "PSnDCG@3"):  # normalised PS metrics add 0/0 for empty points
        assert dropped[name] == pytest.approx(kept[name])


def test_padded_true_labels_and_chunks_agree():
    padded = pad_label_ids(TRUE).numpy()
    assert padded.shape == (3, 2)
    reference = compute_xmc_metrics(PREDICTIONS, TRUE, ks=(1, 2, 3), propensity=Propensity(INVERSE, 0.5, 0.4))
    assert compute_xmc_metrics(PREDICTIONS, padded, ks=(1, 2, 3), propensity=Propensity(INVERSE, 0.5, 0.4)) == reference
    as_tensors = compute_xmc_metrics(
        torch.from_numpy(PREDICTIONS), torch.from_numpy(padded), ks=(1, 2, 3), propensity=Propensity(INVERSE, 0.5, 0.4)
    )
    assert as_tensors == reference
    padded_lists = [[1, 2], [4, -100], [-100, -100]]
    assert (
        compute_xmc_metrics(PREDICTIONS, padded_lists, ks=(1, 2, 3), propensity=Propensity(INVERSE, 0.5, 0.4))
        == reference
    )
    chunked = compute_xmc_metrics(
        PREDICTIONS, padded, ks=(1, 2, 3), propensity=Propensity(INVERSE, 0.5, 0.4), chunk_size=1
    )
    assert chunked == pytest.approx(reference, abs=1e-12)


def random_problem(seed, num_points=400, num_labels=60, k=5):
    rng = np.random.default_rng(seed)
    train = [rng.choice(num_labels, size=rng.integers(1, 6), replace=False).tolist() for _ in range(1500)]
    train.append(list(range(num_labels)))  # every label seen, so napkinxc's count vector has L entries
    true = [rng.choice(num_labels, size=rng.integers(0, 8), replace=False).tolist() for _ in range(num_points)]
    # Distinct scores -> a strict ranking; plant some true labels high so that hits are frequent.
    scores = rng.random((num_points, num_labels))
    for row, labels in enumerate(true):
        scores[row, labels] += rng.random(len(labels)) * 0.8
    top = np.argsort(-scores, axis=1)[:, :k]
    return train, true, top


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_napkinxc(seed):
    train, true, top = random_problem(seed)
    num_labels = 60
    frequencies = np.bincount([label for labels in train for label in labels], minlength=num_labels)
    propensity = Propensity.from_frequencies(frequencies, len(train))
    np.testing.assert_allclose(propensity.inverse, napkin.Jain_et_al_inverse_propensity(train), rtol=1e-12)
    ranking = top.tolist()
    ours = compute_xmc_metrics(top, true, ks=range(1, 6), propensity=propensity)
    raw = compute_xmc_metrics(top, true, ks=range(1, 6), propensity=propensity, normalize_propensity=False)
    # Agreement: napkinxc keeps points without labels with score 0 (zero_division=0), normalises PSP/PSnDCG
    # by the ratio of dataset sums and divides PSnDCG by the per-point unit-gain IDCG, as we do.
    # Differences: napkinxc silently ignores true labels beyond its inv_ps vector (we raise), sizes its
    # count vector by the largest label seen in training (we take L from the frequencies, so unseen tail
    # labels get q_l = 1 + C B^-A), and its PSDCG (without n) divides by k; we do not offer PSDCG.
    references = {
        "P": napkin.precision_at_k(true, ranking, k=5),
        "nDCG": napkin.ndcg_at_k(true, ranking, k=5),
        "R": napkin.recall_at_k(true, ranking, k=5),
        "PSP": napkin.psprecision_at_k(true, ranking, propensity.inverse, k=5),
        "PSnDCG": napkin.psndcg_at_k(true, ranking, propensity.inverse, k=5),
    }
    unnormalised = {
        "PSP": napkin.psprecision_at_k(true, ranking, propensity.inverse, k=5, normalize=False),
        "PSnDCG": napkin.psndcg_at_k(true, ranking, propensity.inverse, k=5, normalize=False),
    }
    assert 0.05 < ours["P@1"] < 0.95  # the problem is neither trivial nor hopeless
    for name, values in references.items():
        for k in range(1, 6):
            assert ours[f"{name}@{k}"] == pytest.approx(values[k - 1], abs=1e-6), f"{name}@{k}"
    for name, values in unnormalised.items():
        for k in range(1, 6):
            assert raw[f"{name}@{k}"] == pytest.approx(values[k - 1], abs=1e-6), f"{name}@{k}"


def test_propensity_presets_and_override():
    assert propensity_parameters() == (0.55, 1.5)
    assert propensity_parameters("Amazon-670K") == (0.6, 2.6)
    assert propensity_parameters("amazon-3m") == (0.6, 2.6)
    assert propensity_parameters("WikiLSHTC-325K") == (0.5, 0.4)
    assert propensity_parameters("LF-Wikipedia-500K") == (0.5, 0.4)
    assert propensity_parameters("EURLex-4K") == (0.55, 1.5)
    assert propensity_parameters("Amazon-670K", a=0.7) == (0.7, 2.6)
    propensity = Propensity.from_frequencies(np.array([10, 0, 3]), 100, a=0.5, b=0.4)
    c = (math.log(100) - 1) * 1.4**0.5
    np.testing.assert_allclose(propensity.inverse, 1 + c * (np.array([10, 0, 3]) + 0.4) ** -0.5)
    result = compute_xmc_metrics(np.array([[0]]), [[0]], ks=(1,), propensity=propensity)
    assert (result["propensity_a"], result["propensity_b"]) == (0.5, 0.4)


def test_propensities_of_many_labels_hold_int32_counts_and_no_float64_array():
    """Every rank of a sharded run holds the propensities: 1M labels' int64 counts are held as int32 (4 MB, where a
    float64 array took 8 MB and its expression 16 MB), the caller's counts are left as they were, the metrics read q
    at the ids they score only (no `[L]` array), and q is the formula's to the bit, at any ids and in whole."""
    import tracemalloc

    counts = np.random.default_rng(0).integers(0, 1000, 1_000_000)
    original = counts.copy()
    top = np.random.default_rng(1).permutation(1_000_000)[:3000].reshape(1000, 3)
    true = [[int(row[1])] for row in top]
    tracemalloc.start()
    propensity = Propensity.from_frequencies(counts, 5000, a=0.55, b=1.5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    held = tracemalloc.get_traced_memory()[0]
    metrics = compute_xmc_metrics(top, true, ks=(1, 3), propensity=propensity)
    metrics_peak = tracemalloc.get_traced_memory()[1] - held
    tracemalloc.stop()
    assert peak < 0.55 * counts.nbytes and metrics_peak < 0.2 * counts.nbytes, (peak, metrics_peak)
    assert metrics["PSP@1"] == 0 and metrics["PSP@3"] > 0
    c = (math.log(5000) - 1) * 2.5**0.55
    expected = 1 + c * (original.astype(np.float64) + 1.5) ** -0.55
    np.testing.assert_array_equal(propensity.inverse, expected)
    np.testing.assert_array_equal(propensity.of(top), expected[top])
    np.testing.assert_array_equal(counts, original)
    assert propensity.label_count == 1_000_000
    with pytest.raises(ValueError, match="non-negative training counts"):
        Propensity.from_frequencies(np.array([1, -1]), 10)


def test_input_errors():
    with pytest.raises(ValueError, match="max\\(ks\\) = 5"):
        compute_xmc_metrics(PREDICTIONS, TRUE, ks=(1, 5))
    with pytest.raises(ValueError, match="predicts a label twice"):
        compute_xmc_metrics(np.array([[1, 1]]), [[1]], ks=(2,))
    with pytest.raises(ValueError, match="3 predictions but 2"):
        compute_xmc_metrics(PREDICTIONS, TRUE[:2], ks=(1,))
    with pytest.raises(ValueError, match="propensity size"):
        compute_xmc_metrics(np.array([[9]]), [[0]], ks=(1,), propensity=Propensity(INVERSE, 0.55, 1.5))
    for ks in ((), (0, 1), (-1, 1), (0,)):
        with pytest.raises(ValueError, match=r"ks must be positive integers, got \["):
            compute_xmc_metrics(PREDICTIONS, TRUE, ks=ks)
    for top in (PREDICTIONS[0], PREDICTIONS.astype(np.float32)):  # one row without its batch dimension; floats
        with pytest.raises(ValueError, match=r"^top_k_ids must be an integer \[N, K\] array, got "):
            compute_xmc_metrics(top, TRUE, ks=(1,))
    with pytest.raises(ValueError, match=r"^point 1 lists a true label twice$"):
        compute_xmc_metrics(PREDICTIONS, [[1, 2], [4, 4], []], ks=(1,))


def test_propensities_and_buckets_refuse_counts_that_are_not_a_vector_of_non_negative_integers():
    from haste_hf.metrics import frequency_buckets, metrics_by_frequency

    for counts in ([3, -1, 2], [[1, 2]]):
        with pytest.raises(
            ValueError, match=r"^label_frequencies must be a 1-D array of non-negative training counts$"
        ):
            Propensity.from_frequencies(counts, 10)
        with pytest.raises(
            ValueError, match=r"^train_frequencies must be a 1-D array of non-negative training counts$"
        ):
            frequency_buckets(counts)
    for points in (0, -3):
        with pytest.raises(ValueError, match=rf"^num_train_points must be positive, got {points}$"):
            Propensity.from_frequencies([3, 1, 2], points)
    assert Propensity.from_frequencies([], 1).inverse.shape == (0,)  # no labels, one training point: nothing to refuse
    with pytest.raises(ValueError, match=r"^label ids must be below the frequency table's size 3$"):
        metrics_by_frequency(np.array([[0], [3]]), [[0], [1]], np.array([5, 1, 1]), k=1)
    with pytest.raises(ValueError, match=r"^label ids must be below the frequency table's size 3$"):
        metrics_by_frequency(np.array([[0], [1]]), [[0], [3]], np.array([5, 1, 1]), k=1)


def test_filter_top_k_refuses_a_ranking_that_is_not_a_matrix():
    with pytest.raises(ValueError, match=r"^top_ids must be \[N, K\], got shape \(3,\)$"):
        filter_top_k(np.array([4, 2, 7]), np.array([[0, 2]]), k=2)


def test_compute_metrics_reads_the_rankings_from_a_tuple_of_predictions():
    compute = make_compute_metrics(ks=(1, 3))
    expected = compute_xmc_metrics(PREDICTIONS, pad_label_ids(TRUE), ks=(1, 3))
    for predictions in (PREDICTIONS, (PREDICTIONS, np.zeros((3, 3))), [PREDICTIONS]):
        assert compute(EvalPrediction(predictions=predictions, label_ids=pad_label_ids(TRUE))) == expected


# ----------------------------------------------------------------------------------------------------------
# Filtering


def test_filter_top_k_keeps_order_and_pads():
    top = np.array([[4, 2, 7, 1], [3, 0, 5, 6], [1, 2, -1, -1]])
    pairs = np.array([[0, 2], [0, 1], [1, 3], [1, 0], [1, 5], [2, 9]])
    np.testing.assert_array_equal(filter_top_k(top, pairs, k=2), [[4, 7], [6, -1], [1, 2]])
    # row_offset shifts the batch into the filter file's numbering: these rows are points 1..3.
    np.testing.assert_array_equal(filter_top_k(top[:1], pairs, k=3, row_offset=1), [[4, 2, 7]])
    assert max_filtered_per_point(pairs) == 3 and max_filtered_per_point(np.zeros((0, 2), int)) == 0


# ----------------------------------------------------------------------------------------------------------
# Trainer and evaluate integration


def test_compute_metrics_on_trainer_outputs():
    logits = torch.randn(6, 20)
    labels = [[1, 2], [3], [], [19, 0, 5], [7], [8, 9]]
    padded = pad_label_ids(labels)
    # Trainer concatenates batches, padding label_ids with -100 to the widest batch.
    top = logits.topk(3).indices.numpy()
    label_ids = np.full((6, 3), -100)
    label_ids[:3, :2], label_ids[3:] = padded[:3, :2].numpy(), padded[3:].numpy()
    propensity = Propensity(np.linspace(1, 3, 20), 0.55, 1.5)
    compute_metrics = make_compute_metrics(ks=(1, 3), propensity=propensity)
    result = compute_metrics(EvalPrediction(predictions=top, label_ids=label_ids))
    assert result == compute_xmc_metrics(top, labels, ks=(1, 3), propensity=propensity)

    pairs = np.array([[0, int(top[0, 0])]])
    filtered = make_compute_metrics(ks=(1,), filter_pairs=pairs)(EvalPrediction(predictions=top, label_ids=label_ids))
    expected_top = top[:, :1].copy()
    expected_top[0, 0] = top[0, 1]
    assert filtered == compute_xmc_metrics(expected_top, labels, ks=(1,))


def test_evaluate_metric_matches(tmp_path):
    propensity = Propensity(INVERSE, 0.55, 1.5)
    metric = XMCMetric(ks=(1, 3), propensity=propensity, keep_in_memory=True, cache_dir=str(tmp_path))
    metric.add_batch(predictions=PREDICTIONS[:2].tolist(), references=TRUE[:2])
    metric.add_batch(predictions=[[0, 1]], references=[[-100]])  # short ranking, padded reference
    result = metric.compute()
    assert result == compute_xmc_metrics(PREDICTIONS, TRUE, ks=(1, 3), propensity=propensity)
    assert XMCMetric(ks=(1,), cache_dir=str(tmp_path)).compute(predictions=[[3]], references=[[3]])["P@1"] == 1.0


def test_the_module_names_only_what_it_defines():
    """`XMCMetric` is defined on first use (it imports `evaluate`); any other missing name is an AttributeError, so
    `hasattr` and `from haste_hf.metrics import X` answer as for any module."""
    import haste_hf.metrics

    assert haste_hf.metrics.XMCMetric is XMCMetric
    assert not hasattr(haste_hf.metrics, "XMCMetrics")
    with pytest.raises(AttributeError, match="module 'haste_hf.metrics' has no attribute 'precision_at'"):
        haste_hf.metrics.precision_at  # noqa: B018


@pytest.mark.parametrize(
    "name",
    ["AmazonTitles-670K", "Amazon670K", "LF-AmazonTitles-131K", "AmazonTitles-3M", "amazon_3m", "LF-Amazon-131K"],
)
def test_propensity_presets_match_every_spelling_of_the_amazon_datasets(name):
    assert propensity_parameters(name) == (0.6, 2.6)


@pytest.mark.parametrize("name", ["AmazonCat-13K", "LF-AmazonCat-13K", "EURLex-4K", "deps"])
def test_propensity_presets_leave_other_datasets_at_the_default(name):
    assert propensity_parameters(name) == (0.55, 1.5)


# ---------------------------------------------------------------------------------------------- by frequency


def test_frequency_buckets_put_the_most_frequent_in_the_head_and_the_rest_by_count():
    from haste_hf.metrics import frequency_buckets

    counts = np.array([0, 1, 2, 5, 6, 20, 21, 100, 101, 500, 7, 1])
    names, bucket = frequency_buckets(counts, head_fraction=0.1)  # ceil(1.2) = 2 head labels: 500 and 101
    assert names == ["head", "0", "1", "2-5", "6-20", "21-100", "101+"]
    assert [names[b] for b in bucket] == [
        "0",
        "1",
        "2-5",
        "2-5",
        "6-20",
        "6-20",
        "21-100",
        "21-100",
        "head",
        "head",
        "6-20",
        "1",
    ]
    with pytest.raises(ValueError, match="head_fraction"):
        frequency_buckets(counts, head_fraction=1.5)


def test_metrics_by_frequency_shares_add_up_to_the_ranking_metrics_and_recall_is_per_bucket():
    from haste_hf.metrics import Propensity, compute_xmc_metrics, frequency_buckets, metrics_by_frequency

    rng = np.random.default_rng(7)
    label_count, points = 60, 200
    counts = rng.integers(0, 150, size=label_count)
    truth = [rng.choice(label_count, size=rng.integers(1, 6), replace=False) for _ in range(points)]
    # Rankings that find some true labels: half of each point's labels first, then random others.
    top = np.stack(
        [
            np.concatenate([t[: len(t) // 2 + 1], rng.permutation(np.setdiff1d(np.arange(label_count), t))])[:5]
            for t in truth
        ]
    )
    propensity = Propensity.from_frequencies(counts, 1000)
    table = metrics_by_frequency(top, truth, counts, k=5, propensity=propensity)
    overall = compute_xmc_metrics(top, truth, ks=(5,), propensity=propensity)
    assert sum(row["P@5 share"] for row in table.values()) == pytest.approx(overall["P@5"], rel=1e-12)
    assert sum(row["PSP@5 share"] for row in table.values()) == pytest.approx(overall["PSP@5"], rel=1e-12)
    names, bucket = frequency_buckets(counts)
    for index, name in enumerate(names):
        pairs = [(i, label) for i, t in enumerate(truth) for label in t if bucket[label] == index]
        assert table[name]["test_pairs"] == len(pairs)
        assert table[name]["labels"] == int((bucket == index).sum())
        expected = sum(label in top[i] for i, label in pairs) / len(pairs) if pairs else 0.0
        assert table[name]["R@5"] == pytest.approx(expected, rel=1e-12)
        slots = sum(bucket[label] == index for row in top for label in row if label >= 0)
        assert table[name]["top-5 share"] == pytest.approx(slots / (5 * points), rel=1e-12)
    assert sum(row["top-5 share"] for row in table.values()) == pytest.approx(1.0)
    for bad in (top[:, :4], top[0]):  # fewer columns than k; one row without its batch dimension
        with pytest.raises(ValueError, match=r"top_k_ids must be \[N, >= 5\], got \("):
            metrics_by_frequency(bad, truth, counts, k=5)
    for short in (truth[:-1], truth[:5]):  # a true label set for each ranking, however many columns it has
        with pytest.raises(ValueError, match=rf"^200 predictions but {len(short)} true label sets$"):
            metrics_by_frequency(top, short, counts, k=5)
