# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The label plan of a HASTE model: which labels the dense head serves and in which order the tail groups
the rest, decided once from a training split.

A `LabelLayout` holds the head label ids, the tail labels in group order, the group size G, how the groups
were formed (strategy, seed), the training counts of every label and a fingerprint of the training split
they were computed from. It is built once (`LabelLayout.from_training_split`), saved as one safetensors file
(what `haste-hf group` writes), checked against the split it is used with (`check_split`) and consumed by
`HasteForExtremeClassification.from_encoder_pretrained(layout=...)`, which checks it against the model it
builds (G, label count, head size).
"""

import hashlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from ..modeling.configuration_haste import DEFAULT_HEAD_LABEL_FRACTION, head_label_count_for
from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH
from ..modeling.label_positions import check_each_label_once
from ..modeling.logging_utils import get_logger
from ..modeling.saving import atomic_path
from .embeddings import blend_label_texts_, compute_label_embeddings
from .grouping import GROUPING_STRATEGIES, ArrayLike, LabelGrouping, check_frequency_bands, group_labels


logger = get_logger(__name__)


# Bumped whenever a layout file written by this code could not be read correctly by older code.
LAYOUT_FORMAT_VERSION = 1


# The head / tail split: the most frequent labels go to the dense head, the rest to the sparse tail.
def split_head_tail(
    label_frequencies: ArrayLike,
    head_label_fraction: float | None = None,
    head_label_count: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Split labels into a dense head (the most frequent ones) and a sparse tail.

    Args:
        label_frequencies: `[label_count]` number of positive training instances of each label.
        head_label_fraction: share of all labels that go to the head, in `[0, 1]` (rounded to the nearest count).
        head_label_count: number of labels that go to the head. Pass exactly one of `head_label_fraction`, `head_label_count`.

    Returns:
        `(head_ids, tail_ids)`: int64 arrays, each sorted by descending count; equal counts are ordered by
        ascending label id, so the split is deterministic.
    """
    counts = (
        label_frequencies.detach().cpu().numpy()
        if isinstance(label_frequencies, torch.Tensor)
        else np.asarray(label_frequencies)
    )
    if counts.ndim != 1:
        raise ValueError(f"`label_frequencies` must be one-dimensional, got shape {counts.shape}.")
    if counts.size and not np.issubdtype(counts.dtype, np.number):
        raise ValueError(f"`label_frequencies` must be numeric, got dtype {counts.dtype}.")
    counts = counts.astype(np.float64)
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise ValueError("`label_frequencies` must be finite and non-negative.")
    label_count = counts.shape[0]

    if (head_label_fraction is None) == (head_label_count is None):
        raise ValueError(
            "Pass exactly one of `head_label_fraction` (share of labels in the head, in [0, 1]) or `head_label_count` "
            f"(number of head labels); got head_label_fraction={head_label_fraction}, head_label_count={head_label_count}."
        )
    if head_label_fraction is not None:
        if isinstance(head_label_fraction, bool) or not 0.0 <= float(head_label_fraction) <= 1.0:
            raise ValueError(f"`head_label_fraction` must be a number in [0, 1], got {head_label_fraction!r}.")
        head_label_count = head_label_count_for(head_label_fraction, label_count)
    elif isinstance(head_label_count, bool) or not isinstance(head_label_count, (int, np.integer)):
        raise ValueError(f"`head_label_count` must be an integer, got {head_label_count!r}.")
    elif not 0 <= head_label_count <= label_count:
        raise ValueError(
            f"`head_label_count` must be in [0, {label_count}] (the number of labels), got {head_label_count}."
        )

    by_frequency = np.argsort(-counts, kind="stable").astype(np.int64)
    return by_frequency[:head_label_count], by_frequency[head_label_count:]


def _int64_vector(values, name: str) -> torch.Tensor:
    tensor = values.detach().cpu() if isinstance(values, torch.Tensor) else torch.as_tensor(np.asarray(values))
    if tensor.ndim != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(tensor.shape)}.")
    if tensor.numel() and (tensor.is_floating_point() or tensor.dtype == torch.bool):
        raise ValueError(f"`{name}` must hold integer label ids, got dtype {tensor.dtype}.")
    return tensor.to(torch.int64).contiguous()


# Points per batch: the fingerprint hashes each batch's lengths, then its ids, so both kinds of input must be
# cut alike for a split to have one fingerprint.
_BATCH_POINTS = 65536


def _label_batches(labels) -> Iterable[tuple[np.ndarray, np.ndarray]]:
    """`(lengths, flat ids)` int64 batches of `_BATCH_POINTS` points of a `datasets.Dataset`'s `labels` column
    or of label-id lists."""
    if hasattr(labels, "with_format") and "labels" in getattr(labels, "column_names", ()):
        import pyarrow.compute as pc

        for batch in labels.select_columns(["labels"]).with_format("arrow").iter(batch_size=_BATCH_POINTS):
            column = batch.column("labels")
            yield (
                pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64),
                pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int64),
            )
        return
    rows = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids in labels]
    for start in range(0, max(len(rows), 1), _BATCH_POINTS):
        batch = rows[start : start + _BATCH_POINTS]
        lengths = np.asarray([row.size for row in batch], dtype=np.int64)
        yield lengths, (np.concatenate(batch) if batch else np.empty(0, np.int64))


class _BatchedColumn:
    """A `datasets.Dataset` column read in Arrow batches: iterating `dataset[name]` builds its rows one at a time,
    several times slower (tens of seconds over the 2M points of LF-Paper2Keywords-8.6M)."""

    def __init__(self, dataset, name: str):
        self.dataset, self.name = dataset, name

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        for batch in self.dataset.select_columns([self.name]).iter(batch_size=_BATCH_POINTS):
            yield from batch[self.name]


def _column(split, name: str):
    return _BatchedColumn(split, name) if hasattr(split, "select_columns") else split[name]


def count_labels(labels, label_count: int) -> tuple[np.ndarray, str, int]:
    """Training counts `[label_count]` (int64), the split's fingerprint and its number of points, in one pass.

    `labels` is a `datasets.Dataset` with a `labels` column of positive ids, or an iterable of id lists. The
    fingerprint is a SHA-256 of every point's positive ids in order: two splits share it only if they hold the
    same label lists in the same order, so a plan computed on another split (another validation hold-out, a
    filtered or shuffled copy) is caught before it trains a model.
    """
    from ..data import count_ids

    digest = hashlib.sha256(f"haste-label-split-v1:{label_count}".encode())
    points = [0]

    def checked_batches():
        for lengths, flat in _label_batches(labels):
            if flat.size and (flat.min() < 0 or flat.max() >= label_count):
                raise ValueError(
                    f"Training label ids must lie in [0, {label_count}) (the label count), found [{flat.min()}, {flat.max()}]."
                )
            digest.update(lengths.tobytes())
            digest.update(flat.tobytes())
            points[0] += lengths.size
            yield flat

    counts = count_ids(checked_batches(), label_count)
    return counts, digest.hexdigest(), points[0]


@dataclass(eq=False)
class LabelLayout:
    """Head labels, tail labels in group order and the split they were computed from.

    Attributes:
        label_count: number of labels L.
        head_ids: int64 `[H]`: the labels of the dense head, most frequent first.
        tail_order: int64 `[L - H]`: the other labels, group `k` being `tail_order[k * G : (k + 1) * G]`.
        group_size: labels per tail group G.
        strategy: how the tail was grouped (`"semantic"`, `"frequency"` or `"random"`).
        seed: seed of the grouping.
        label_frequencies: int64 `[L]` positive training points of each label, or None.
        split_fingerprint: `count_labels`' fingerprint of the training split, or None when unknown.
        train_points: number of points of that split (0 when unknown).
        frequency_bands: the bands of training count the tail was grouped within (`group_labels`); empty: one pool.
    """

    label_count: int
    head_ids: torch.Tensor
    tail_order: torch.Tensor
    group_size: int
    strategy: str = "semantic"
    seed: int = 0
    label_frequencies: torch.Tensor | None = None
    split_fingerprint: str | None = None
    train_points: int = 0
    frequency_bands: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("label_count", "group_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
            setattr(self, name, int(value))
        if self.strategy not in GROUPING_STRATEGIES:
            raise ValueError(f"`strategy` must be one of {GROUPING_STRATEGIES}, got {self.strategy!r}.")
        self.frequency_bands = check_frequency_bands(self.frequency_bands)
        self.head_ids = _int64_vector(self.head_ids, "head_ids")
        self.tail_order = _int64_vector(self.tail_order, "tail_order")
        check_each_label_once(
            (self.head_ids, self.tail_order),
            self.label_count,
            f"`head_ids` ({self.head_ids.numel()}) and `tail_order` ({self.tail_order.numel()}) must together hold "
            f"every label id in [0, {self.label_count}) exactly once.",
        )
        if self.label_frequencies is not None:
            self.label_frequencies = _int64_vector(self.label_frequencies, "label_frequencies")
            if self.label_frequencies.numel() != self.label_count:
                raise ValueError(
                    f"`label_frequencies` has {self.label_frequencies.numel()} entries for {self.label_count} labels."
                )

    # ------------------------------------------------------------------------------------------------ building

    @classmethod
    def from_frequencies(
        cls,
        label_frequencies,
        group_size: int,
        *,
        head_label_fraction: float | None = None,
        head_label_count: int | None = None,
        strategy: str = "semantic",
        label_embeddings: torch.Tensor | np.ndarray | None = None,
        frequency_bands=None,
        beta: float = 16,
        seed: int = 0,
        split_fingerprint: str | None = None,
        train_points: int = 0,
        device: str | torch.device | None = None,
        show_progress: bool = True,
    ) -> "LabelLayout":
        """The head/tail split of `label_frequencies` and the tail's groups.

        The head takes the most frequent labels: `head_label_count` of them, or a `head_label_fraction` of all
        labels (default: the paper's 3%, when neither is given). The tail is grouped by `strategy`; `"semantic"`
        needs `label_embeddings` (`[L, d]`, see `compute_label_embeddings`); with `frequency_bands`, inside each band
        of training count (`group_labels`).
        """
        frequencies = _int64_vector(label_frequencies, "label_frequencies")
        if head_label_count is None and head_label_fraction is None:
            head_label_fraction = DEFAULT_HEAD_LABEL_FRACTION
        head_ids, tail_ids = split_head_tail(
            frequencies, head_label_fraction=head_label_fraction, head_label_count=head_label_count
        )
        if strategy == "semantic" and label_embeddings is None and len(tail_ids):
            raise ValueError(
                'strategy="semantic" needs `label_embeddings` (see `compute_label_embeddings`), or use '
                "`LabelLayout.from_training_split` with an encoder."
            )
        grouping = group_labels(
            label_embeddings,
            tail_ids,
            group_size,
            strategy,
            label_frequencies=frequencies,
            frequency_bands=frequency_bands,
            beta=beta,
            seed=seed,
            device=device,
            show_progress=show_progress,
        )
        return cls(
            label_count=frequencies.numel(),
            head_ids=head_ids,
            tail_order=grouping.order,
            group_size=group_size,
            strategy=strategy,
            seed=seed,
            label_frequencies=frequencies,
            split_fingerprint=split_fingerprint,
            train_points=train_points,
            frequency_bands=frequency_bands or (),
        )

    @classmethod
    def from_training_split(
        cls,
        split,
        label_count: int,
        group_size: int,
        *,
        head_label_fraction: float | None = None,
        head_label_count: int | None = None,
        strategy: str = "semantic",
        encoder=None,
        tokenizer=None,
        pooling: str | None = None,
        label_embeddings: torch.Tensor | np.ndarray | None = None,
        label_texts=None,
        label_text_grouping_below: int = 0,
        frequency_bands=None,
        max_length: int | None = DEFAULT_MAX_LENGTH,
        batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
        beta: float = 16,
        seed: int = 0,
        device: str | torch.device | None = None,
        show_progress: bool = True,
    ) -> "LabelLayout":
        """The plan of a training split (a `datasets.Dataset` with `text` and `labels` columns).

        Counts the labels, fingerprints the split and, for `strategy="semantic"`, embeds the labels with
        `encoder` (and `tokenizer`, `pooling`, `max_length`, `batch_size`; see `compute_label_embeddings`)
        unless `label_embeddings` are given. With `label_text_grouping_below` m > 0, the labels with fewer than m
        training points are grouped by their text (`label_texts`, by id) too (`embeddings.blend_label_texts_`).
        `frequency_bands`: the tail is grouped inside bands of training count (`group_labels`).
        """
        if label_text_grouping_below:
            if strategy != "semantic":
                raise ValueError(
                    f"`label_text_grouping_below` blends label texts into the label embeddings of semantic grouping; "
                    f"the grouping is {strategy!r}: group semantically or leave it out."
                )
            if label_texts is None or encoder is None:
                raise ValueError("`label_text_grouping_below` needs the `label_texts` and the `encoder` to embed them.")
        started = time.perf_counter()
        frequencies, fingerprint, points = count_labels(split, label_count)
        logger.info(f"Counted the labels of {points:,} training points in {time.perf_counter() - started:.1f} s.")
        embedding_options = dict(
            tokenizer=tokenizer,
            batch_size=batch_size,
            max_length=max_length,
            pooling=pooling,
            device=device,
            show_progress=show_progress,
        )
        if strategy == "semantic" and label_embeddings is None:
            if encoder is None:
                raise ValueError('strategy="semantic" needs an `encoder` (or precomputed `label_embeddings`).')
            label_embeddings = compute_label_embeddings(
                encoder, _column(split, "text"), _column(split, "labels"), label_count, **embedding_options
            )
        elif label_text_grouping_below:  # blended in place: not into the caller's tensor
            label_embeddings = torch.as_tensor(label_embeddings).clone()
        if label_text_grouping_below:
            blend_label_texts_(
                label_embeddings, label_texts, frequencies, label_text_grouping_below, encoder, **embedding_options
            )
        return cls.from_frequencies(
            frequencies,
            group_size,
            head_label_fraction=head_label_fraction,
            head_label_count=head_label_count,
            strategy=strategy,
            label_embeddings=label_embeddings,
            frequency_bands=frequency_bands,
            beta=beta,
            seed=seed,
            split_fingerprint=fingerprint,
            train_points=points,
            device=device,
            show_progress=show_progress,
        )

    @classmethod
    def from_model(cls, model) -> "LabelLayout":
        """The layout a trained model was built with (its `output_labels`); counts and fingerprint are unknown."""
        config = model.config
        output_labels = model.output_layer.output_labels.detach().cpu()
        tail = output_labels[config.head_label_count :]
        return cls(
            label_count=config.label_count,
            head_ids=output_labels[: config.head_label_count],
            tail_order=tail[tail >= 0],
            group_size=config.group_size,
        )

    # ------------------------------------------------------------------------------------------------ views

    @property
    def head_label_count(self) -> int:
        return self.head_ids.numel()

    @property
    def tail_label_count(self) -> int:
        return self.tail_order.numel()

    @property
    def tail_group_count(self) -> int:
        return self.grouping.num_groups

    @property
    def grouping(self) -> LabelGrouping:
        return LabelGrouping(self.tail_order, self.group_size, self.strategy)

    def output_labels(self) -> torch.Tensor:
        """The model's `output_labels` buffer: head ids, then the tail groups, the last padded with -1."""
        return self.grouping.output_labels(self.head_ids)

    def describe(self) -> str:
        bands = f", within training-count bands up to {list(self.frequency_bands)}" if self.frequency_bands else ""
        return (
            f"{self.label_count:,} labels (head {self.head_label_count:,}, tail {self.tail_label_count:,} in "
            f"{self.tail_group_count:,} {self.strategy} groups of {self.group_size}{bands})"
        )

    # ------------------------------------------------------------------------------------------------ checks

    def check_split(self, split, what: str = "the training split") -> None:
        """Raises a ValueError unless `split` is the training split this layout was computed from."""
        if self.split_fingerprint is None:
            return
        _, fingerprint, points = count_labels(split, self.label_count)
        if fingerprint != self.split_fingerprint:
            sizes = (
                f"({self.train_points:,} points) than {what} ({points:,} points)"
                if points != self.train_points
                else f"than {what}, of as many points ({points:,}) but other label lists or another order"
            )
            raise ValueError(
                f"This label layout was computed from another training split {sizes}: the head/tail split and the "
                "groups would not match the training data. Compute the layout with the same data and the same validation hold-out "
                "(`haste-hf group` takes `--validation-fraction` and `--seed` as `train` does)."
            )

    def check_options(
        self,
        group_size: int | None = None,
        head_label_fraction: float | None = None,
        strategy: str | None = None,
        frequency_bands=None,
    ) -> None:
        """Raises a ValueError when a structure option given beside the layout contradicts it (None: not given)."""
        if group_size is not None and group_size != self.group_size:
            raise ValueError(
                f"`group_size` ({group_size}) differs from the label layout's G ({self.group_size}): leave it out, or "
                f"compute a layout with G = {group_size}."
            )
        if head_label_fraction is not None:
            head_label_count = head_label_count_for(head_label_fraction, self.label_count)
            if head_label_count != self.head_label_count:
                raise ValueError(
                    f"`head_label_fraction` ({head_label_fraction}) gives a head of {head_label_count} labels, the label "
                    f"layout's has {self.head_label_count}: leave it out, or compute a layout with this fraction."
                )
        if strategy is not None and strategy != self.strategy:
            raise ValueError(
                f"The label layout's groups are {self.strategy}, not {strategy}: leave the grouping option out, or "
                "compute a layout with it."
            )
        if frequency_bands is not None and check_frequency_bands(frequency_bands) != self.frequency_bands:
            raise ValueError(
                f"The label layout's groups were formed within the training-count bands {list(self.frequency_bands)}, "
                f"not {list(frequency_bands)}: leave `frequency_bands` out, or compute a layout with them."
            )

    # ------------------------------------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike) -> None:
        """Writes the layout to one safetensors file (atomically: a failed save leaves no partial file)."""
        from safetensors.torch import save_file

        tensors = {"head_ids": self.head_ids, "tail_order": self.tail_order}
        if self.label_frequencies is not None:
            tensors["label_frequencies"] = self.label_frequencies
        metadata = {
            "format": "haste_label_layout",
            "format_version": str(LAYOUT_FORMAT_VERSION),
            "label_count": str(self.label_count),
            "group_size": str(self.group_size),
            "strategy": self.strategy,
            "seed": str(self.seed),
            "train_points": str(self.train_points),
        }
        if self.split_fingerprint is not None:
            metadata["split_fingerprint"] = self.split_fingerprint
        if self.frequency_bands:  # older readers ignore it: the groups themselves are in `tail_order`
            metadata["frequency_bands"] = ",".join(map(str, self.frequency_bands))
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        with atomic_path(path) as staging:
            save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, staging, metadata=metadata)

    @classmethod
    def load(cls, path: str | os.PathLike, label_frequencies: bool = True) -> "LabelLayout":
        """The layout of a file `save` wrote; `label_frequencies=False` leaves its training counts out (int64 `[L]`,
        8 GB at 10^9 labels: the ranks of a sharded run other than the first, whose model card alone reads them)."""
        from safetensors import SafetensorError, safe_open

        try:
            handle = safe_open(os.fspath(path), framework="pt")
        except SafetensorError as error:
            raise ValueError(
                f"{path} is not a label layout file, or a damaged one ({error}): write it again with `haste-hf group`."
            ) from error
        with handle as f:
            metadata = f.metadata() or {}
            if metadata.get("format") != "haste_label_layout":
                raise ValueError(
                    f"{path} is not a label layout file (write one with `LabelLayout.save` or `haste-hf group`)."
                )
            if int(metadata["format_version"]) > LAYOUT_FORMAT_VERSION:
                raise ValueError(
                    f"{path} has layout format {metadata['format_version']}; this haste_hf reads up to "
                    f"{LAYOUT_FORMAT_VERSION}: upgrade haste_hf."
                )
            names = set(f.keys())
            return cls(
                label_count=int(metadata["label_count"]),
                head_ids=f.get_tensor("head_ids"),
                tail_order=f.get_tensor("tail_order"),
                group_size=int(metadata["group_size"]),
                strategy=metadata["strategy"],
                seed=int(metadata["seed"]),
                label_frequencies=(
                    f.get_tensor("label_frequencies") if label_frequencies and "label_frequencies" in names else None
                ),
                split_fingerprint=metadata.get("split_fingerprint"),
                train_points=int(metadata.get("train_points", 0)),
                frequency_bands=tuple(int(b) for b in metadata.get("frequency_bands", "").split(",") if b),
            )


__all__ = ["LAYOUT_FORMAT_VERSION", "LabelLayout", "count_labels"]
