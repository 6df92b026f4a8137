# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Label grouping for the group-shared sparse tail.

The last of three steps, all computed from the training split only (`layout.split_head_tail` sends the most
frequent labels to the dense head; `embeddings.compute_label_embeddings` embeds each tail label as the
normalised mean of its positive training texts' embeddings):

`group_labels`: the tail labels are ordered so that groups of `group_size` related labels are contiguous.
   The semantic strategy approximates the objective "maximise the summed cosine similarity of each label to
   its group centroid" (see `grouping_objective`) in two stages: spherical k-means into about
   `N / (beta * group_size)` buckets, then greedy nearest-neighbour groups inside each bucket.

The resulting `LabelGrouping.order` is the tail's label order; `LabelGrouping.output_labels` turns it into the
model's `output_labels` buffer, which is how the grouping is saved with the model.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..modeling.logging_utils import get_logger


logger = get_logger(__name__)

GROUPING_STRATEGIES = ("semantic", "frequency", "random")


# Bytes of temporary memory one chunked step may allocate (similarity blocks, gathered bucket members).
_CPU_CHUNK_BYTES = 256 * 2**20
_CUDA_CHUNK_BYTES = 2 * 2**30

ArrayLike = torch.Tensor | np.ndarray | Sequence


def _default_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _chunk_bytes(device: torch.device) -> int:
    return _CUDA_CHUNK_BYTES if device.type == "cuda" else _CPU_CHUNK_BYTES


def _as_int64_vector(values: ArrayLike, name: str) -> torch.Tensor:
    tensor = values.detach().cpu() if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
    if tensor.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(tensor.shape)}.")
    if tensor.numel() > 0 and (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool):
        raise ValueError(f"`{name}` must hold integer label ids, got dtype {tensor.dtype}.")
    return tensor.to(torch.int64)


# ----------------------------------------------------------------------------------------------------------
# Label groups
# ----------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class LabelGrouping:
    """Tail labels in group-contiguous order.

    Attributes:
        order: int64 `[N]`, the tail label ids; group `k` is `order[k * group_size : (k + 1) * group_size]`.
            Every group has exactly `group_size` labels except possibly the last.
        group_size: labels per group `G`.
        strategy: how the groups were formed (`"semantic"`, `"frequency"` or `"random"`).
    """

    order: torch.Tensor
    group_size: int
    strategy: str = "semantic"

    def __post_init__(self):
        self.order = _as_int64_vector(self.order, "order")
        is_integer = isinstance(self.group_size, (int, np.integer)) and not isinstance(self.group_size, bool)
        if not is_integer or self.group_size < 1:
            raise ValueError(f"`group_size` must be a positive integer, got {self.group_size!r}.")
        self.group_size = int(self.group_size)

    @property
    def label_count(self) -> int:
        return self.order.numel()

    @property
    def num_groups(self) -> int:
        return math.ceil(self.label_count / self.group_size)

    def groups(self) -> torch.Tensor:
        """`[num_groups, group_size]` int64 label ids; the last group is padded with -1."""
        padded = torch.full((self.num_groups * self.group_size,), -1, dtype=torch.int64)
        padded[: self.label_count] = self.order
        return padded.view(self.num_groups, self.group_size)

    def output_labels(self, head_ids: ArrayLike | None = None) -> torch.Tensor:
        """The model's `output_labels` buffer: head label ids, then the flattened (padded) groups."""
        head = _as_int64_vector(head_ids if head_ids is not None else [], "head_ids")
        return torch.cat([head, self.groups().reshape(-1)])


def _normalized_rows(
    embeddings: torch.Tensor, label_ids: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`embeddings[label_ids]` with unit rows, in `dtype` on `device`, and the mask of non-zero rows."""
    num_rows, dim = label_ids.numel(), embeddings.shape[1]
    rows_per_chunk = max(1, _chunk_bytes(device) // (4 * dim))
    out = torch.empty(num_rows, dim, dtype=dtype, device=device)
    nonzero = torch.empty(num_rows, dtype=torch.bool, device=device)
    for start in range(0, num_rows, rows_per_chunk):
        ids = label_ids[start : start + rows_per_chunk].to(embeddings.device)
        rows = embeddings[ids].to(device=device, dtype=torch.float32)
        norms = rows.norm(dim=1)
        if not torch.isfinite(norms).all():
            raise ValueError("`embeddings` of the labels to group contain NaN or infinite values.")
        nonzero[start : start + rows_per_chunk] = norms > 0
        out[start : start + rows_per_chunk] = (rows / norms.clamp_min(1e-30).unsqueeze(1)).to(dtype)
    return out, nonzero


def _assign_to_centroids(
    x: torch.Tensor, centroids: torch.Tensor, with_sums: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Index of the most similar centroid of each row; with `with_sums`, also the per-centroid sums of rows
    and each row's similarity to its centroid."""
    num_rows = x.shape[0]
    rows_per_chunk = max(1, _chunk_bytes(x.device) // (x.element_size() * centroids.shape[0]))
    assignment = torch.empty(num_rows, dtype=torch.int64, device=x.device)
    sums = torch.zeros(centroids.shape, dtype=torch.float32, device=x.device) if with_sums else None
    similarity = torch.empty(num_rows, dtype=torch.float32, device=x.device) if with_sums else None
    for start in range(0, num_rows, rows_per_chunk):
        block = x[start : start + rows_per_chunk]
        best, nearest = (block @ centroids.T).max(dim=1)
        assignment[start : start + rows_per_chunk] = nearest
        if with_sums:
            sums.index_add_(0, nearest, block.float())
            similarity[start : start + rows_per_chunk] = best.float()
    return assignment, sums, similarity


def _spherical_kmeans(
    x: torch.Tensor,
    num_clusters: int,
    num_iters: int,
    generator: torch.Generator,
    sample_fraction: float = 0.5,
    tolerance: float = 1e-3,
) -> torch.Tensor:
    """Cluster id of each unit row of `x`.

    Lloyd iterations on cosine similarity run on a random `sample_fraction` of the rows (as mini-batch k-means,
    at a fraction of the cost), starting from random sample rows; then every row joins its most similar
    centroid. A cluster left empty (two starting rows alike: labels of the same name embed alike) restarts at
    the rows least similar to their centroids, so that every cluster is in use while the rows differ.
    """
    num_sampled = max(num_clusters, int(sample_fraction * x.shape[0]))
    sample = x[torch.randperm(x.shape[0], generator=generator, device=x.device)[:num_sampled]]
    num_rows = sample.shape[0]
    centroids = sample[:num_clusters]
    previous = None
    for _ in range(num_iters):
        assignment, sums, similarity = _assign_to_centroids(sample, centroids, with_sums=True)
        empty = (torch.bincount(assignment, minlength=num_clusters) == 0).nonzero().squeeze(1)
        if previous is not None and not empty.numel() and (assignment != previous).sum() <= tolerance * num_rows:
            break
        previous = assignment
        if empty.numel():
            sums[empty] = sample[similarity.topk(empty.numel(), largest=False).indices].float()
        centroids = F.normalize(sums, dim=1).to(x.dtype)
    return _assign_to_centroids(x, centroids, with_sums=False)[0]


def _split_large_buckets(
    x: torch.Tensor, bucket: torch.Tensor, max_bucket_size: int, generator: torch.Generator, power_iters: int = 8
) -> torch.Tensor:
    """Halves every bucket larger than `max_bucket_size` at the median of its principal direction, repeatedly.

    All oversized buckets of a round are split at once: principal directions by batched power iteration with
    segment sums (`index_add_`), medians by one sort.
    """
    bucket = bucket.clone()
    num_buckets = int(bucket.max()) + 1
    while True:
        sizes = torch.bincount(bucket, minlength=num_buckets)
        is_large = sizes > max_bucket_size
        num_large = int(is_large.sum())
        if num_large == 0:
            return bucket
        members = is_large[bucket].nonzero().squeeze(1)
        local = (torch.cumsum(is_large, 0) - 1)[bucket[members]]  # index among the oversized buckets
        local_sizes = sizes[is_large]
        rows = x[members].float()
        means = torch.zeros(num_large, x.shape[1], device=x.device).index_add_(0, local, rows)
        rows -= (means / local_sizes.unsqueeze(1))[local]
        direction = torch.randn(num_large, x.shape[1], generator=generator, device=x.device)
        for _ in range(power_iters):
            projection = (rows * direction[local]).sum(dim=1, keepdim=True)
            direction = F.normalize(torch.zeros_like(direction).index_add_(0, local, rows * projection), dim=1)
        projection = (rows * direction[local]).sum(dim=1)
        # Sort by projection, then stably by bucket: the rank inside each bucket follows the projection.
        by_projection = torch.sort(projection, stable=True).indices
        by_bucket = by_projection[torch.sort(local[by_projection], stable=True).indices]
        starts = torch.cumsum(local_sizes, 0) - local_sizes
        rank = torch.empty_like(local)
        rank[by_bucket] = torch.arange(members.numel(), device=x.device) - starts[local[by_bucket]]
        upper = 2 * rank >= local_sizes[local]
        bucket[members[upper]] = num_buckets + local[upper]
        num_buckets += num_large


def _greedy_groups(
    x: torch.Tensor, bucket: torch.Tensor, group_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy nearest-neighbour groups inside each bucket.

    A bucket of `n` rows yields `n // group_size` groups: a random unassigned seed and its `group_size - 1`
    most similar unassigned rows, repeatedly; the `n % group_size` rows left over are returned. Buckets are
    processed many at once (padded to the largest in the batch), so the Python loop runs over the group index
    within a bucket, not over groups.

    Returns:
        `(groups [num_groups, group_size], leftover [num_leftover])`: row indices of `x`.
    """
    device = x.device
    sizes = torch.bincount(bucket)
    by_bucket = torch.sort(bucket, stable=True).indices
    starts = torch.cumsum(sizes, 0) - sizes
    # Largest buckets first, so that each batch is padded little and its active buckets are a prefix.
    bucket_ids = torch.sort(sizes, descending=True, stable=True).indices
    bucket_ids = bucket_ids[sizes[bucket_ids] >= group_size]
    sizes_cpu = sizes[bucket_ids].cpu()

    groups, leftovers = [], []
    if bucket_ids.numel() < sizes.numel():  # buckets too small for a single group
        is_small = sizes < group_size
        leftovers.append(is_small[bucket].nonzero().squeeze(1))
    bytes_per_row = x.shape[1] * x.element_size()
    first = 0
    while first < bucket_ids.numel():
        width = int(sizes_cpu[first])
        count = max(1, min(bucket_ids.numel() - first, _chunk_bytes(device) // (width * bytes_per_row)))
        batch_ids = bucket_ids[first : first + count]
        batch_sizes = sizes[batch_ids]
        groups_per_bucket = (sizes_cpu[first : first + count] // group_size).tolist()
        first += count

        slot = torch.arange(width, device=device)
        valid = slot < batch_sizes.unsqueeze(1)
        members = by_bucket[(starts[batch_ids].unsqueeze(1) + slot).clamp_max(by_bucket.numel() - 1)]
        members = torch.where(valid, members, 0)
        vectors = x[members]  # [count, width, d]
        available = valid.clone()
        formed = torch.empty(count, groups_per_bucket[0], group_size, dtype=torch.int64, device=device)
        active_counts = np.searchsorted(-np.asarray(groups_per_bucket), -np.arange(groups_per_bucket[0]), "left")
        for step, active in enumerate(active_counts.tolist()):
            open_ = available[:active]
            noise = torch.rand(active, width, generator=generator, device=device)
            seed = noise.masked_fill(~open_, -1.0).argmax(dim=1)
            rows = torch.arange(active, device=device)
            seed_vectors = vectors[rows, seed].unsqueeze(2)
            similarity = torch.bmm(vectors[:active], seed_vectors).squeeze(2).float()
            similarity = similarity.masked_fill(~open_, -math.inf)
            similarity[rows, seed] = math.inf  # the seed belongs to its own group, even among ties
            chosen = similarity.topk(group_size, dim=1).indices
            open_.scatter_(1, chosen, False)
            formed[:active, step] = members[:active].gather(1, chosen)
        is_formed = torch.arange(groups_per_bucket[0]) < torch.as_tensor(groups_per_bucket).unsqueeze(1)
        groups.append(formed[is_formed.to(device)])
        leftovers.append(members[available])

    groups = torch.cat(groups) if groups else torch.empty(0, group_size, dtype=torch.int64, device=device)
    leftover = torch.cat(leftovers) if leftovers else torch.empty(0, dtype=torch.int64, device=device)
    return groups, leftover


class _StageClock:
    """Seconds spent in each named stage (the device synchronised at each end), for the log."""

    def __init__(self, device: torch.device):
        self.device, self.seconds = device, {}

    def __call__(self, name: str, function, *args):
        started = time.perf_counter()
        result = function(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started
        return result


def _semantic_order(
    x: torch.Tensor, group_size: int, beta: float, kmeans_iters: int, generator: torch.Generator, show_progress: bool
) -> torch.Tensor:
    """Row order of `x` (unit rows) in which consecutive `group_size` rows form the semantic groups.

    Each round clusters the pool into `max(1, n // (beta * G))` buckets (halving buckets larger than
    `2 * beta * G`), forms the greedy groups and carries the bucket remainders over to the next round. The
    round with a single bucket leaves fewer than `G` rows: the last, partial group. The time of the clustering
    and of the greedy groups is logged.
    """
    clock = _StageClock(x.device)
    pool = torch.arange(x.shape[0], device=x.device)
    pieces = []
    progress = tqdm(total=x.shape[0], desc="Grouping labels", unit="label", disable=not show_progress)
    while pool.numel():
        bucket_size = beta * group_size
        num_clusters = max(1, int(pool.numel() // bucket_size))
        vectors = x if pool.numel() == x.shape[0] else x[pool]
        if num_clusters == 1:
            bucket = torch.zeros(pool.numel(), dtype=torch.int64, device=x.device)
        else:
            bucket = clock("clustering", _spherical_kmeans, vectors, num_clusters, kmeans_iters, generator)
            bucket = clock("clustering", _split_large_buckets, vectors, bucket, int(2 * bucket_size), generator)
        groups, leftover = clock("greedy groups", _greedy_groups, vectors, bucket, group_size, generator)
        pieces.append(pool[groups.reshape(-1)])
        progress.update(groups.numel())
        if num_clusters == 1:
            pieces.append(pool[leftover])
            progress.update(leftover.numel())
            break
        if leftover.numel() == pool.numel():
            beta *= 2  # no bucket held a full group: use fewer, larger buckets (ends with a single bucket)
        pool = pool[leftover]
    progress.close()
    logger.info(
        f"Grouped {x.shape[0]:,} labels: "
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in clock.seconds.items())
    )
    return torch.cat(pieces) if pieces else pool  # no label with an embedding: nothing to order


def group_labels(
    embeddings: torch.Tensor | np.ndarray | None,
    label_ids: ArrayLike,
    group_size: int,
    strategy: str = "semantic",
    *,
    label_frequencies: ArrayLike | None = None,
    frequency_bands: Sequence[int] | None = None,
    beta: float = 16,
    seed: int = 0,
    device: str | torch.device | None = None,
    kmeans_iters: int = 10,
    dtype: torch.dtype | None = None,
    show_progress: bool = True,
) -> LabelGrouping:
    """Orders the labels `label_ids` so that consecutive groups of `group_size` labels are related.

    Strategies:
        - `"semantic"`: spherical k-means of the label embeddings into `max(1, N // (beta * group_size))`
          buckets, then inside each bucket greedy groups of a random unassigned seed and its
          `group_size - 1` most similar unassigned labels; bucket remainders are grouped again the same way
          until fewer than `group_size` are left. Labels with an all-zero embedding (no positive training
          instance) come last, in the order of `label_ids`.
        - `"frequency"`: descending `label_frequencies` (ties by ascending id), consecutive `group_size`.
        - `"random"`: a random permutation.
    Every group has exactly `group_size` labels except possibly the last.

    With `frequency_bands`, a label is grouped only with labels of its band of training counts (`frequency_bands_of`):
    each band, the rarest first, is grouped by `strategy` on its own, so that a group of labels seen once does not
    share its support with labels seen a hundred times.

    Args:
        embeddings: `[label_count, d]` label embeddings indexed by label id (as returned by
            `compute_label_embeddings`); only the rows of `label_ids` are used. Required by `"semantic"`.
        label_ids: ids of the labels to group (the tail), distinct and non-negative.
        group_size: labels per group `G`.
        strategy: `"semantic"`, `"frequency"` or `"random"`.
        label_frequencies: `[label_count]` training counts, indexed by label id. Required by `"frequency"` and by
            `frequency_bands`.
        frequency_bands: increasing upper bounds of the bands of training counts (`(1, 5)`: labels seen once, 2 to
            5 times, more often); None or empty: one pool.
        beta: average bucket size in groups (`>= 1`); the paper uses 16.
        seed: seeds the k-means initialisation, greedy seeds and random permutation. Results are reproducible
            on one device type; CUDA float atomics may break near-ties differently between runs.
        device: where the semantic grouping runs; defaults to CUDA when available.
        kmeans_iters: maximum number of k-means iterations (stops early when fewer than 0.1% of labels move).
        dtype: compute dtype of the similarities; defaults to bfloat16 on CUDA and float32 elsewhere.
        show_progress: show a tqdm progress bar over the labels grouped (semantic strategy).
    """
    if strategy not in GROUPING_STRATEGIES:
        raise ValueError(f"`strategy` must be one of {GROUPING_STRATEGIES}, got {strategy!r}.")
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"`group_size` must be a positive integer, got {group_size!r}.")
    group_size = int(group_size)
    label_ids = _as_int64_vector(label_ids, "label_ids")
    if label_ids.numel():
        if int(label_ids.min()) < 0:
            raise ValueError("`label_ids` must be non-negative label ids.")
        seen = torch.zeros(int(label_ids.max()) + 1, dtype=torch.bool)  # a bool per id, not an int64 count
        seen[label_ids] = True
        if int(seen.sum()) != label_ids.numel():
            raise ValueError("`label_ids` must not contain duplicates.")
        del seen
    max_id = int(label_ids.max()) if label_ids.numel() else -1

    if frequency_bands:
        bands = frequency_bands_of(label_ids, label_frequencies, frequency_bands, group_size)
        options = dict(beta=beta, seed=seed, device=device, kmeans_iters=kmeans_iters, dtype=dtype)
        pieces = [
            group_labels(
                embeddings,
                band,
                group_size,
                strategy,
                label_frequencies=label_frequencies,
                **options,
                show_progress=show_progress,
            ).order
            for band in bands
        ]
        return LabelGrouping(torch.cat(pieces) if pieces else label_ids, group_size, strategy)

    if strategy == "random":
        generator = torch.Generator().manual_seed(seed)
        return LabelGrouping(label_ids[torch.randperm(label_ids.numel(), generator=generator)], group_size, strategy)

    if strategy == "frequency":
        if label_frequencies is None:
            raise ValueError('`label_frequencies` is required with strategy="frequency".')
        counts = _counts_of(label_frequencies, max_id)
        # Equal counts by ascending id: sort the ids first, then stably by count.
        by_id = torch.sort(label_ids).indices
        order = by_id[torch.sort(-counts[label_ids[by_id]], stable=True).indices]
        return LabelGrouping(label_ids[order], group_size, strategy)

    if embeddings is None:
        raise ValueError('`embeddings` are required with strategy="semantic" (see `compute_label_embeddings`).')
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 1:
        raise ValueError(f"`beta` (average bucket size in groups) must be a number >= 1, got {beta!r}.")
    if isinstance(kmeans_iters, bool) or not isinstance(kmeans_iters, int) or kmeans_iters < 1:
        raise ValueError(f"`kmeans_iters` must be a positive integer, got {kmeans_iters!r}.")
    embeddings = torch.from_numpy(embeddings) if isinstance(embeddings, np.ndarray) else embeddings
    if embeddings.ndim != 2 or embeddings.shape[0] <= max_id:
        raise ValueError(
            f"`embeddings` must be [label_count, d] with a row for every id in `label_ids` (at least {max_id + 1} "
            f"rows), got shape {tuple(embeddings.shape)}."
        )
    if label_ids.numel() == 0:
        return LabelGrouping(label_ids, group_size, strategy)

    device = _default_device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    generator = torch.Generator(device=device).manual_seed(seed)
    vectors, has_embedding = _normalized_rows(embeddings, label_ids, device, dtype)
    with_embedding = has_embedding.nonzero().squeeze(1)
    if with_embedding.numel() < label_ids.numel():
        vectors = vectors[with_embedding]
    order = with_embedding[_semantic_order(vectors, group_size, float(beta), kmeans_iters, generator, show_progress)]
    order = torch.cat([order, (~has_embedding).nonzero().squeeze(1)]).cpu()
    return LabelGrouping(label_ids[order], group_size, strategy)


def _counts_of(label_frequencies: ArrayLike, max_id: int) -> torch.Tensor:
    """`label_frequencies` as float64, checked to cover every label id up to `max_id`."""
    counts = torch.as_tensor(
        label_frequencies.detach().cpu().numpy()
        if isinstance(label_frequencies, torch.Tensor)
        else np.asarray(label_frequencies)
    ).to(torch.float64)
    if counts.ndim != 1 or counts.numel() <= max_id:
        raise ValueError(
            f"`label_frequencies` must be one-dimensional and cover every id in `label_ids` (at least {max_id + 1} "
            f"entries), got shape {tuple(counts.shape)}."
        )
    return counts


def check_frequency_bands(frequency_bands: Sequence[int] | None) -> tuple[int, ...]:
    """`frequency_bands` as a tuple of increasing positive integers (empty: none), or a ValueError naming the fix."""
    bands = tuple(frequency_bands or ())
    if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in bands) or any(
        low >= high for low, high in zip(bands, bands[1:])
    ):
        raise ValueError(
            f"`frequency_bands` must be increasing positive training counts (e.g. 1 5: labels seen once, 2-5 times, "
            f"more often), got {list(bands)}."
        )
    return tuple(int(b) for b in bands)


def frequency_bands_of(
    label_ids: torch.Tensor, label_frequencies: ArrayLike | None, frequency_bands: Sequence[int], group_size: int
) -> list[torch.Tensor]:
    """`label_ids` cut into bands of training count, the rarest first, each band a whole number of groups.

    Band `i` holds the labels with `bounds[i-1] < count <= bounds[i]` (the last: above the last bound), except that
    the `size % group_size` most frequent labels of a band move up to the next one, so that only the last band may
    end in a partial group and every group lies inside one band. Inside a band, labels are in ascending count
    (ties by ascending id); empty bands are left out.
    """
    bands = check_frequency_bands(frequency_bands)
    if label_frequencies is None:
        raise ValueError("`frequency_bands` needs `label_frequencies` (the training count of every label).")
    if not label_ids.numel():
        return []
    counts = _counts_of(label_frequencies, int(label_ids.max()))[label_ids]
    by_id = torch.sort(label_ids).indices
    ascending = by_id[torch.sort(counts[by_id], stable=True).indices]
    ends = torch.searchsorted(counts[ascending], torch.tensor(bands, dtype=torch.float64), right=True)
    ends = [int(end) // group_size * group_size for end in ends.tolist()] + [label_ids.numel()]
    starts = [0] + ends[:-1]
    return [label_ids[ascending[start:end]] for start, end in zip(starts, ends) if end > start]


@torch.no_grad()
def grouping_objective(
    embeddings: torch.Tensor | np.ndarray,
    grouping: LabelGrouping,
    device: str | torch.device | None = None,
) -> float:
    """Mean cosine similarity of each grouped label's embedding to its group centroid (higher is better).

    This is the paper's grouping objective divided by the number of labels. Labels with an all-zero embedding
    count with similarity 0.
    """
    embeddings = torch.from_numpy(embeddings) if isinstance(embeddings, np.ndarray) else embeddings
    if grouping.label_count == 0:
        return 0.0
    device = _default_device(device)
    group_size = grouping.group_size
    # Chunks are whole groups, so no group straddles two chunks.
    rows_per_chunk = group_size * max(1, _chunk_bytes(device) // (4 * embeddings.shape[1] * group_size))
    total = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, grouping.label_count, rows_per_chunk):
        ids = grouping.order[start : start + rows_per_chunk]
        vectors, _ = _normalized_rows(embeddings, ids, device, torch.float32)
        group = torch.arange(ids.numel(), device=device) // group_size
        centroids = torch.zeros(int(group[-1]) + 1, vectors.shape[1], device=device).index_add_(0, group, vectors)
        total += (vectors * F.normalize(centroids, dim=1)[group]).sum(dtype=torch.float64)
    return float(total) / grouping.label_count
