"""Extreme multi-label ranking metrics computed from top-k predictions, never from a dense `[N, L]` matrix.

Definitions, for a point with true label set y and predictions p_1..p_k (best first), d_r = 1/log2(r+1):

- P@k = |{r <= k : p_r in y}| / k;   R@k = |{r <= k : p_r in y}| / |y|
- nDCG@k = sum_{r<=k, p_r in y} d_r / IDCG_k(y),   IDCG_k(y) = sum_{r <= min(k, |y|)} d_r
- PSP@k and PSnDCG@k replace the unit gain of a hit by the inverse propensity q_l = 1/p_l (Jain et al. 2016)
  and are normalised as pyxclib does: the dataset sum of the scores divided by the dataset sum of the best
  achievable scores (each point's true labels ranked by q_l). PSnDCG divides each point's (PS)DCG by the
  unit-gain IDCG_k(y) above (a per-point denominator, as napkinxc does; it agrees with pyxclib) before
  summing.

Points without true labels are kept by default and score 0 on every metric (pyxclib's convention); they
then lower P, nDCG and R, and leave the normalised PS metrics unchanged (0 over 0 added to the sums).
`drop_empty_points=True` removes them from the averages instead.

Predicted ids below 0 (e.g. -1) mean "no prediction" and never hit. Predictions must not repeat an id.

Filtered evaluation (`filter_labels_test.txt` pairs) happens on the metric side with `Trainer`: predict
`max(ks) + max_filtered_per_point(pairs)` candidates and `filter_top_k` drops the filtered ones before the top k
is taken (`make_compute_metrics(filter_pairs=...)` does this). Where full label-order scores exist, such as a
prediction loop, `filter_scores_` sets them to -inf on the model side instead; both give the same ranking.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import datasets
import numpy as np
import torch


DEFAULT_KS = (1, 3, 5)
# `evaluate.load(EVALUATE_METRIC_PATH)`: the loading script of `XMCMetric` (a local path, as `evaluate` takes one).
EVALUATE_METRIC_PATH = str(Path(__file__).with_name("evaluate_metric") / "xmc.py")
METRIC_NAMES = ("P", "nDCG", "PSP", "PSnDCG", "R")

# (A, B) of Jain et al. (2016) by dataset family; see `propensity_parameters` for how names are matched.
AMAZON_PROPENSITY_PARAMETERS = (0.6, 2.6)
WIKIPEDIA_PROPENSITY_PARAMETERS = (0.5, 0.4)
DEFAULT_PROPENSITY_PARAMETERS = (0.55, 1.5)


def propensity_parameters(
    dataset_name: str | None = None, a: float | None = None, b: float | None = None
) -> tuple[float, float]:
    """The (A, B) of the propensity model: explicit values win, else the preset matching `dataset_name`.

    Names are compared lowercased with everything but letters and digits removed, so `LF-AmazonTitles-131K`,
    `AmazonTitles-670K`, `Amazon670K` and `amazon_3m` are all spelled alike. The Amazon product datasets (names
    with `amazon`, except the category set AmazonCat) -> (0.6, 2.6); `WikiLSHTC` and `Wikipedia` -> (0.5, 0.4);
    anything else -> (0.55, 1.5). Code bases disagree on the matching rule, so report the values.
    """
    preset = DEFAULT_PROPENSITY_PARAMETERS
    if dataset_name is not None:
        name = re.sub(r"[^a-z0-9]", "", dataset_name.lower())
        if "amazon" in name and "amazoncat" not in name:
            preset = AMAZON_PROPENSITY_PARAMETERS
        elif "wikilshtc" in name or "wikipedia" in name:
            preset = WIKIPEDIA_PROPENSITY_PARAMETERS
    return (preset[0] if a is None else float(a), preset[1] if b is None else float(b))


class Propensity:
    """Inverse propensities q_l = 1/p_l of `L` labels with the (A, B) that produced them: given as a float64 `[L]`
    array (`Propensity(inverse, a, b)`), or from training counts (`from_frequencies`), which are then all it holds
    (int32 where they fit: 4 bytes a label) and turns into q only for the labels asked for (`of`). Every rank of a
    sharded run holds one: a float64 `[L]` array is 8 GB at 10^9 labels where the counts are 4."""

    def __init__(self, inverse, a: float, b: float):
        self._inverse, self._counts, self._scale = np.asarray(inverse, dtype=np.float64), None, None
        self.a, self.b = a, b

    @classmethod
    def from_frequencies(
        cls,
        label_frequencies: np.ndarray,
        num_train_points: int,
        dataset_name: str | None = None,
        a: float | None = None,
        b: float | None = None,
    ) -> Propensity:
        """q_l = 1 + C (N_l + B)^(-A), C = (ln N - 1)(B + 1)^A, from training counts N_l and N training points.
        The counts are read, not copied, where they are int32 or narrower (or not integers); wider integers that fit
        int32 are held as int32."""
        a, b = propensity_parameters(dataset_name, a, b)
        counts = np.asarray(label_frequencies)
        if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.number) or (counts.size and counts.min() < 0):
            raise ValueError("label_frequencies must be a 1-D array of non-negative training counts")
        if num_train_points < 1:
            raise ValueError(f"num_train_points must be positive, got {num_train_points}")
        narrow = np.iinfo(np.int32).max
        if (
            np.issubdtype(counts.dtype, np.integer)
            and counts.itemsize > 4
            and (not counts.size or counts.max() <= narrow)
        ):
            counts = counts.astype(np.int32)
        propensity = cls(np.zeros(0), a, b)
        propensity._inverse, propensity._counts = None, counts
        propensity._scale = (math.log(num_train_points) - 1.0) * (b + 1.0) ** a
        return propensity

    @property
    def label_count(self) -> int:
        return len(self._inverse if self._counts is None else self._counts)

    def of(self, label_ids) -> np.ndarray:
        """q of each id of the integer array `label_ids` (any shape; ids in `[0, label_count)`), float64."""
        if self._counts is None:
            return self._inverse[label_ids]
        return self._from_counts(self._counts[label_ids])

    @property
    def inverse(self) -> np.ndarray:
        """q of every label, float64 `[L]` (computed anew from counts: `of` takes only the labels needed)."""
        return self._inverse if self._counts is None else self._from_counts(self._counts)

    def _from_counts(self, counts: np.ndarray) -> np.ndarray:
        inverse = np.array(counts, dtype=np.float64)  # one array, computed in place
        inverse += self.b
        np.power(inverse, -self.a, out=inverse)
        inverse *= self._scale
        inverse += 1.0
        return inverse

    def __repr__(self) -> str:
        held = "given" if self._counts is None else f"from {self._counts.dtype} counts"
        return f"Propensity({self.label_count} labels, {held}, a={self.a}, b={self.b})"


# ----------------------------------------------------------------------------------------------------------
# Core computation


def _pad_true_labels(true_labels, start: int, stop: int) -> np.ndarray:
    """Rows `start:stop` of the true labels as an int64 array padded with -1 (negative inputs are padding)."""
    if isinstance(true_labels, np.ndarray) and true_labels.ndim == 2:
        rows = true_labels[start:stop].astype(np.int64, copy=True)
        rows[rows < 0] = -1
        return rows
    rows = [np.asarray(labels, dtype=np.int64).reshape(-1) for labels in true_labels[start:stop]]
    rows = [labels[labels >= 0] for labels in rows]
    padded = np.full((len(rows), max([1] + [len(r) for r in rows])), -1, dtype=np.int64)
    for i, labels in enumerate(rows):
        padded[i, : len(labels)] = labels
    return padded


def _has_repeats(ids: np.ndarray) -> np.ndarray:
    """Per row: does any non-negative id occur twice?"""
    ordered = np.sort(ids, axis=1)
    return ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(axis=1)


def compute_xmc_metrics(
    top_k_ids: np.ndarray,
    true_labels: np.ndarray | Sequence[Sequence[int]],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    propensity: Propensity | None = None,
    drop_empty_points: bool = False,
    normalize_propensity: bool = True,
    chunk_size: int = 8192,
) -> dict[str, float]:
    """P@k, nDCG@k, R@k and, given `propensity`, PSP@k and PSnDCG@k for every k in `ks`.

    Args:
        top_k_ids: int `[N, K]` predicted label ids sorted best first, `K >= max(ks)`; negative = no prediction.
        true_labels: per point, its true label ids: a list of arrays/lists, or an int `[N, P]` array or tensor
            (e.g. the -100 padded `labels` of `XMCDataCollator`). Negative values are padding.
        propensity: inverse propensities from the training split; adds PSP@k, PSnDCG@k and the
            `propensity_a`, `propensity_b` used.
        drop_empty_points: leave points without true labels out of the averages (default: keep them with
            score 0, as pyxclib does).
        normalize_propensity: report PSP/PSnDCG as a ratio to the best achievable (pyxclib's convention);
            `False` gives the plain averages.

    Returns:
        `{"P@1": ..., "nDCG@1": ..., "PSP@1": ..., "PSnDCG@1": ..., "R@1": ..., ...}` as Python floats.
    """
    if isinstance(true_labels, torch.Tensor):
        true_labels = true_labels.cpu().numpy()
    top_k_ids = top_k_ids.cpu().numpy() if isinstance(top_k_ids, torch.Tensor) else np.asarray(top_k_ids)
    ks = sorted({int(k) for k in ks})
    if not ks or ks[0] < 1:
        raise ValueError(f"ks must be positive integers, got {ks}")
    if top_k_ids.ndim != 2 or not np.issubdtype(top_k_ids.dtype, np.integer):
        raise ValueError(f"top_k_ids must be an integer [N, K] array, got {top_k_ids.dtype} {top_k_ids.shape}")
    max_k = ks[-1]
    if top_k_ids.shape[1] < max_k:
        raise ValueError(f"top_k_ids has {top_k_ids.shape[1]} columns but max(ks) = {max_k}; predict more labels")
    num_points = top_k_ids.shape[0]
    if len(true_labels) != num_points:
        raise ValueError(f"{num_points} predictions but {len(true_labels)} true label sets")

    discounts = 1.0 / np.log2(np.arange(2, max_k + 2))
    ideal_dcg = np.concatenate([[1.0], np.cumsum(discounts)])  # ideal_dcg[m] = IDCG of m true labels, m>=1
    k_index = np.asarray(ks) - 1
    sums = {name: np.zeros(len(ks)) for name in ("P", "nDCG", "R", "PSP", "PSP_best", "PSnDCG", "PSnDCG_best")}
    counted = 0

    for start in range(0, num_points, chunk_size):
        stop = min(start + chunk_size, num_points)
        predicted = top_k_ids[start:stop, :max_k].astype(np.int64)
        predicted = np.where(predicted < 0, -1, predicted)
        true = _pad_true_labels(true_labels, start, stop)
        if _has_repeats(predicted).any():
            row = start + int(np.flatnonzero(_has_repeats(predicted))[0])
            raise ValueError(f"point {row} predicts a label twice: {top_k_ids[row, :max_k].tolist()}")
        if _has_repeats(true).any():
            row = start + int(np.flatnonzero(_has_repeats(true))[0])
            raise ValueError(f"point {row} lists a true label twice")
        if propensity is not None and max(predicted.max(initial=-1), true.max(initial=-1)) >= propensity.label_count:
            raise ValueError(f"label ids must be below the propensity size {propensity.label_count}")

        num_true = (true >= 0).sum(axis=1)
        if drop_empty_points:
            keep = num_true > 0
            predicted, true, num_true = predicted[keep], true[keep], num_true[keep]
        counted += predicted.shape[0]
        has_true = num_true > 0
        hits = ((predicted[:, :, None] == true[:, None, :]) & (predicted[:, :, None] >= 0)).any(axis=2)
        hits_at = np.cumsum(hits, axis=1)[:, k_index]  # [n, len(ks)]
        # Unit-gain IDCG per point and k; 1 for empty points, whose DCG is 0 anyway.
        ideal = ideal_dcg[np.minimum(num_true[:, None], np.asarray(ks)[None, :])]
        ideal[~has_true] = 1.0

        sums["P"] += hits_at.sum(axis=0) / np.asarray(ks)
        sums["R"] += (hits_at[has_true] / num_true[has_true, None]).sum(axis=0)
        sums["nDCG"] += (np.cumsum(hits * discounts, axis=1)[:, k_index] / ideal).sum(axis=0)
        if propensity is not None:
            gains = np.where(hits, propensity.of(np.maximum(predicted, 0)), 0.0)
            best = -np.sort(-np.where(true >= 0, propensity.of(np.maximum(true, 0)), 0.0), axis=1)
            best = np.pad(best, ((0, 0), (0, max(0, max_k - best.shape[1]))))[:, :max_k]
            sums["PSP"] += np.cumsum(gains, axis=1)[:, k_index].sum(axis=0) / np.asarray(ks)
            sums["PSP_best"] += np.cumsum(best, axis=1)[:, k_index].sum(axis=0) / np.asarray(ks)
            sums["PSnDCG"] += (np.cumsum(gains * discounts, axis=1)[:, k_index] / ideal).sum(axis=0)
            sums["PSnDCG_best"] += (np.cumsum(best * discounts, axis=1)[:, k_index] / ideal).sum(axis=0)

    def ratio(numerator: np.ndarray, denominator: np.ndarray | float) -> np.ndarray:
        denominator = np.broadcast_to(np.asarray(denominator, dtype=np.float64), numerator.shape)
        return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator > 0)

    averages = {name: ratio(sums[name], counted) for name in ("P", "nDCG", "R")}
    if propensity is not None:
        for name in ("PSP", "PSnDCG"):
            averages[name] = ratio(sums[name], sums[f"{name}_best"] if normalize_propensity else counted)
    results = {
        f"{name}@{k}": float(averages[name][i]) for name in METRIC_NAMES if name in averages for i, k in enumerate(ks)
    }
    if propensity is not None:
        results["propensity_a"] = float(propensity.a)
        results["propensity_b"] = float(propensity.b)
    return results


# ----------------------------------------------------------------------------------------------------------
# Where a ranking's points come from: buckets of training frequency

# Tail buckets of training frequency (inclusive bounds), after the head: the labels never seen in training come first.
FREQUENCY_BUCKETS = ((0, 0), (1, 1), (2, 5), (6, 20), (21, 100), (101, None))


def frequency_buckets(train_frequencies: np.ndarray, head_fraction: float = 0.03) -> tuple[list[str], np.ndarray]:
    """Bucket names and each label's bucket index `[L]`: "head" for the `head_fraction` most frequent labels (the
    split `head_label_fraction` makes, ties broken by id), then the others by training count (`FREQUENCY_BUCKETS`)."""
    counts = np.asarray(train_frequencies, dtype=np.int64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("train_frequencies must be a 1-D array of non-negative training counts")
    if not 0 <= head_fraction <= 1:
        raise ValueError(f"head_fraction must be in [0, 1], got {head_fraction}")
    names = ["head"] + [
        f"{low}" if low == high else f"{low}+" if high is None else f"{low}-{high}" for low, high in FREQUENCY_BUCKETS
    ]
    bucket = np.zeros(counts.shape[0], dtype=np.int64)
    for index, (low, high) in enumerate(FREQUENCY_BUCKETS, start=1):
        bucket[(counts >= low) & (counts <= (np.iinfo(np.int64).max if high is None else high))] = index
    head = np.argsort(-counts, kind="stable")[: math.ceil(head_fraction * counts.shape[0])]
    bucket[head] = 0
    return names, bucket


def metrics_by_frequency(
    top_k_ids: np.ndarray,
    true_labels: np.ndarray | Sequence[Sequence[int]],
    train_frequencies: np.ndarray,
    *,
    k: int = 5,
    propensity: Propensity | None = None,
    head_fraction: float = 0.03,
) -> dict[str, dict[str, float]]:
    """Per bucket of training frequency (`frequency_buckets`): how many labels and test pairs it holds, its recall
    R@k (the bucket's true (point, label) pairs found in the top k, over the bucket's true pairs) and its share of
    P@k and, given `propensity`, of PSP@k: the shares of all buckets add up to `compute_xmc_metrics`'s P@k and PSP@k,
    so the table says where a model gains or loses its points. Its share of the top-k slots (the predictions in the
    bucket, right or wrong, over all `k * N`) tells a bucket that misses its labels from one that crowds out the
    others' hits with false positives.

    Returns: `{bucket: {"labels", "test_pairs", "R@k", "P@k share", "PSP@k share", "top-k share"}}`, fractions as
    floats."""
    top = np.asarray(top_k_ids.cpu() if isinstance(top_k_ids, torch.Tensor) else top_k_ids)
    if top.ndim != 2 or top.shape[1] < k:
        raise ValueError(f"top_k_ids must be [N, >= {k}], got {top.shape}")
    if len(true_labels) != top.shape[0]:
        raise ValueError(f"{top.shape[0]} predictions but {len(true_labels)} true label sets")
    names, bucket = frequency_buckets(train_frequencies, head_fraction)
    label_count = bucket.shape[0]
    true = _pad_true_labels(true_labels, 0, top.shape[0])
    predicted = np.where(top[:, :k] < 0, -1, top[:, :k]).astype(np.int64)
    if max(predicted.max(initial=-1), true.max(initial=-1)) >= label_count:
        raise ValueError(f"label ids must be below the frequency table's size {label_count}")
    hits = ((predicted[:, :, None] == true[:, None, :]) & (predicted[:, :, None] >= 0)).any(axis=2)
    found = ((true[:, :, None] == predicted[:, None, :]) & (true[:, :, None] >= 0)).any(axis=2)
    hit_bucket = bucket[np.maximum(predicted, 0)]
    true_bucket = np.where(true >= 0, bucket[np.maximum(true, 0)], -1)
    if propensity is not None:
        gains = np.where(hits, propensity.of(np.maximum(predicted, 0)), 0.0)
        best = -np.sort(-np.where(true >= 0, propensity.of(np.maximum(true, 0)), 0.0), axis=1)
        best_total = np.pad(best, ((0, 0), (0, max(0, k - best.shape[1]))))[:, :k].sum()
    table = {}
    for index, name in enumerate(names):
        pairs = int((true_bucket == index).sum())
        row = {
            "labels": int((bucket == index).sum()),
            "test_pairs": pairs,
            f"R@{k}": float((found & (true_bucket == index)).sum() / pairs) if pairs else 0.0,
            f"P@{k} share": float((hits & (hit_bucket == index)).sum() / (k * top.shape[0])) if top.shape[0] else 0.0,
            f"top-{k} share": float(((predicted >= 0) & (hit_bucket == index)).sum() / (k * top.shape[0]))
            if top.shape[0]
            else 0.0,
        }
        if propensity is not None:
            row[f"PSP@{k} share"] = float(gains[hit_bucket == index].sum() / best_total) if best_total > 0 else 0.0
        table[name] = row
    return table


# ----------------------------------------------------------------------------------------------------------
# Filtered evaluation


def max_filtered_per_point(filter_pairs: np.ndarray) -> int:
    """The most filter pairs any single point has: extra candidates to predict so that k survive filtering."""
    filter_pairs = np.asarray(filter_pairs)
    return int(np.bincount(filter_pairs[:, 0]).max()) if len(filter_pairs) else 0


def filter_top_k(top_ids: np.ndarray, filter_pairs: np.ndarray, k: int, row_offset: int = 0) -> np.ndarray:
    """Removes filtered `(point, label)` pairs from ranked candidates and keeps the first `k` left.

    This is the metric-side filter: `top_ids` `[N, K]` (best first, `K >= k + max_filtered_per_point`)
    comes from the model; rows are points `row_offset .. row_offset + N - 1` of the filter file's numbering.
    Remaining candidates keep their order; missing ones are -1.
    """
    top_ids = np.asarray(top_ids, dtype=np.int64)
    filter_pairs = np.asarray(filter_pairs, dtype=np.int64).reshape(-1, 2)
    if top_ids.ndim != 2:
        raise ValueError(f"top_ids must be [N, K], got shape {top_ids.shape}")
    rows = np.broadcast_to(np.arange(row_offset, row_offset + top_ids.shape[0])[:, None], top_ids.shape)
    # One integer key per (point, label) pair; labels are shifted by 1 so that -1 ("none") stays distinct.
    width = int(max(top_ids.max(initial=-1), filter_pairs[:, 1].max(initial=-1))) + 2
    filtered = np.isin(rows * width + top_ids + 1, filter_pairs[:, 0] * width + filter_pairs[:, 1] + 1)
    filtered |= top_ids < 0
    order = np.argsort(filtered, axis=1, kind="stable")  # surviving candidates first, in rank order
    kept = np.where(np.take_along_axis(filtered, order, axis=1), -1, np.take_along_axis(top_ids, order, axis=1))
    kept = kept[:, :k]
    return np.pad(kept, ((0, 0), (0, k - kept.shape[1])), constant_values=-1)


# ----------------------------------------------------------------------------------------------------------
# transformers.Trainer integration


def make_compute_metrics(
    *,
    ks: Sequence[int] = DEFAULT_KS,
    propensity: Propensity | None = None,
    filter_pairs: np.ndarray | None = None,
    drop_empty_points: bool = False,
    normalize_propensity: bool = True,
) -> Callable:
    """`Trainer(compute_metrics=...)` over the top-k ids of `make_preprocess_logits_for_metrics`.

    `label_ids` are the -100 padded `[N, P]` positives of `XMCDataCollator`. With `filter_pairs`, filtered
    pairs are removed from the ranked candidates here (the evaluation dataset must be in filter-file order,
    which Trainer's sequential evaluation keeps).
    """

    def compute_metrics(eval_prediction) -> dict[str, float]:
        top_ids = eval_prediction.predictions
        if isinstance(top_ids, (tuple, list)):
            top_ids = top_ids[0]
        top_ids = np.asarray(top_ids).astype(np.int64)
        if filter_pairs is not None:
            top_ids = filter_top_k(top_ids, filter_pairs, k=max(ks))
        return compute_xmc_metrics(
            top_ids,
            np.asarray(eval_prediction.label_ids),
            ks=ks,
            propensity=propensity,
            drop_empty_points=drop_empty_points,
            normalize_propensity=normalize_propensity,
        )

    return compute_metrics


# ----------------------------------------------------------------------------------------------------------
# evaluate integration


_EVALUATE_INPUTS = """
Args:
    predictions: per point, predicted label ids sorted best first (at least max(ks) of them; -1 = none).
    references: per point, its true label ids (negative values are padding and ignored).
Returns:
    dict with P@k, nDCG@k, R@k and, when the metric has a propensity, PSP@k, PSnDCG@k, propensity_a/b.
"""


def _define_xmc_metric():
    # `evaluate` imports `transformers.pipelines` (seconds), so the class is built on first access only.
    import evaluate

    class XMCMetric(evaluate.Metric):
        """`evaluate` metric for extreme multi-label ranking, built locally (no Hub download).

        >>> metric = XMCMetric(ks=(1, 3), keep_in_memory=True)
        >>> metric.compute(predictions=[[3, 1, 2]], references=[[1]])["P@3"]
        0.3333333333333333

        Constructor arguments other than `ks`, `propensity`, `drop_empty_points` and `normalize_propensity` go to
        `evaluate.Metric` (e.g. `keep_in_memory`, `cache_dir`, `num_process`, `process_id`).
        """

        def __init__(
            self,
            ks: Sequence[int] = DEFAULT_KS,
            propensity: Propensity | None = None,
            drop_empty_points: bool = False,
            normalize_propensity: bool = True,
            **kwargs,
        ):
            self.ks = tuple(ks)
            self.propensity = propensity
            self.drop_empty_points = drop_empty_points
            self.normalize_propensity = normalize_propensity
            super().__init__(**kwargs)

        def _info(self) -> evaluate.MetricInfo:
            return evaluate.MetricInfo(
                description="Precision, nDCG, recall and propensity-scored precision/nDCG at k for extreme "
                "multi-label classification, computed from top-k predicted label ids.",
                citation="Jain, Prabhu and Varma. Extreme Multi-label Loss Functions for Recommendation, Tagging, "
                "Ranking & Other Missing Label Applications. KDD 2016.",
                inputs_description=_EVALUATE_INPUTS,
                features=datasets.Features(
                    {
                        "predictions": datasets.List(datasets.Value("int64")),
                        "references": datasets.List(datasets.Value("int64")),
                    }
                ),
            )

        def _compute(self, predictions, references) -> dict[str, float]:
            width = max([max(self.ks)] + [len(p) for p in predictions])
            top_ids = np.full((len(predictions), width), -1, dtype=np.int64)
            for row, ids in enumerate(predictions):
                top_ids[row, : len(ids)] = ids
            return compute_xmc_metrics(
                top_ids,
                references,
                ks=self.ks,
                propensity=self.propensity,
                drop_empty_points=self.drop_empty_points,
                normalize_propensity=self.normalize_propensity,
            )

    XMCMetric.__qualname__ = "XMCMetric"
    return XMCMetric


def __getattr__(name: str):
    if name == "XMCMetric":
        globals()["XMCMetric"] = _define_xmc_metric()
        return globals()["XMCMetric"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
