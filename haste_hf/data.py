"""Extreme Classification Repository datasets, a folder at a time (its files are read by `xmc_files`), and the
collator used to train on them.

Every split has a `labels` column (`List(Value("int32"))`, 0-based label ids) and, for raw-text formats, a `text`
column. Malformed input raises `XMCFormatError` (a `ValueError`) naming the file and the 1-based line. The label-id
lists differ in length from example to example, which transformers' collators cannot stack: batch them with
`XMCDataCollator` (`HasteTrainer` builds one; give a stock `transformers.Trainer`
`data_collator=XMCDataCollator(tokenizer)`, or its `default_data_collator` or `DataCollatorWithPadding` fails on them).

Supported layouts (see `load_xmc_dataset`):

- raw text, JSON lines: `trn.json[.gz]`, `tst.json[.gz]` (`uid`, `title`, `content`, `target_ind`) and
  `lbl.json[.gz]` (`uid`, `title`);
- raw text with sparse labels: `trn_X.txt` (one text per line), `trn_X_Y.txt` (header `N L`, lines
  `l:v l:v ...`), `Y.txt` (one label text per line), and the `tst_` counterparts;
- bag of words, single file: `train.txt` / `test.txt` (or `*_train.txt` / `*_test.txt`), header `N D L`,
  lines `l1,l2,... f:v f:v ...` (a line starting with a space has no labels);
- bag of words, split: `trn_X_Xf.txt` (header `N D`, lines `f:v ...`) with `trn_X_Y.txt`;
- filters: `filter_labels_train.txt`, `filter_labels_test.txt` (`doc_idx label_idx` per line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow.compute as pc
import torch
from datasets import Dataset, DatasetDict, concatenate_datasets

from .modeling.defaults import DEFAULT_MAX_LENGTH, LABEL_PADDING_ID
from .xmc_files import (
    TEXT_FEATURES,
    LabelTextShare,
    TextFields,
    XMCFormatError,
    XMCSplit,
    read_bow_file,
    read_filter_file,
    read_json_label_texts,
    read_json_split,
    read_label_texts,
    read_sparse_features,
    read_sparse_label_split,
    read_text_split,
)


if TYPE_CHECKING:
    import scipy.sparse
    from transformers import PreTrainedTokenizerBase


# The dataset layouts `load_xmc_dataset` reads (`auto`: the one the folder's files name).
DATA_FORMATS = ("auto", "json", "text_sparse", "bow", "bow_split")
_SPLIT_PREFIXES = {"train": "trn", "test": "tst"}


@dataclass
class XMCDataset:
    """A dataset directory loaded by `load_xmc_dataset`.

    Attributes:
        splits: `train` and, when present, `test`. Columns `text` (raw-text formats) and `labels` (label-id
            lists of different lengths: batched by `XMCDataCollator`, not by transformers' collators).
        label_texts: one text per label id (a list, or past `COMPACT_LABEL_TEXTS_FROM` labels and for a
            `label_text_share` a compact `LabelNameTable`), or `None` for bag-of-words data.
        label_count: size of the label space L.
        filters: split name -> int64 `[M, 2]` array of `(doc_idx, label_idx)` pairs to exclude from predictions.
        features: split name -> CSR `[N, D]` bag-of-words features, only when asked for.
        train_label_frequencies: int32 `[L]` label counts over the training file (before label-text
            augmentation; `label_frequencies`); use these for propensities, the head/tail split and grouping.
        num_train_points: number of training points in the file (before augmentation).
        format: the layout that was read: `json`, `text_sparse`, `bow` or `bow_split`.
    """

    splits: DatasetDict
    label_texts: Sequence[str] | None
    label_count: int
    filters: dict[str, np.ndarray] = field(default_factory=dict)
    features: dict[str, scipy.sparse.csr_matrix] = field(default_factory=dict)
    train_label_frequencies: np.ndarray | None = None
    num_train_points: int = 0
    format: str = "json"


def label_frequencies(dataset: Dataset, label_count: int, label_column: str = "labels") -> np.ndarray:
    """Counts each label's positives over `dataset` (`[label_count]`, int32: no count exceeds the points, int64 past
    2^31 - 1 points), reading Arrow batches."""

    def checked_batches():
        for batch in dataset.with_format("arrow").iter(batch_size=65536):
            flat = pc.list_flatten(batch.column(label_column)).to_numpy()
            if flat.size and (flat.min() < 0 or flat.max() >= label_count):
                raise ValueError(
                    f"label ids must lie in [0, label_count={label_count}), found [{flat.min()}, {flat.max()}]"
                )
            yield flat

    dtype = np.int32 if len(dataset) <= np.iinfo(np.int32).max else np.int64
    return count_ids(checked_batches(), label_count, dtype=dtype)


def count_ids(batches, label_count: int, dtype=np.int64) -> np.ndarray:
    """`[label_count]` occurrences (of `dtype`) of each id in the batches of ids (checked in range), each batch
    counted by a sort of its own ids: no pass over a `[label_count]` vector per batch (a bincount per batch of 65,536
    points made 62 passes over 800 MB at 10^8 labels and 4M points) and no `[label_count]` int64 temporary beside the
    result (8 GB at 10^9 labels)."""
    counts = np.zeros(label_count, dtype=dtype)
    for flat in batches:
        ids, id_counts = np.unique(flat, return_counts=True)
        counts[ids] += id_counts.astype(dtype)
    return counts


# ----------------------------------------------------------------------------------------------------------
# Directory entry point


def detect_format(path: str | Path) -> str:
    """Names the layout of a dataset directory: `json`, `text_sparse`, `bow_split` or `bow` (in that priority)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    if _find(path, ("trn.json.gz", "trn.json")):
        return "json"
    if (path / "trn_X_Y.txt").is_file() and (path / "trn_X.txt").is_file():
        return "text_sparse"
    if (path / "trn_X_Y.txt").is_file() and (path / "trn_X_Xf.txt").is_file():
        return "bow_split"
    if _bow_file(path, "train"):
        return "bow"
    raise ValueError(
        f"cannot tell the format of {path}: expected trn.json[.gz] + lbl.json[.gz] (raw text), trn_X.txt + "
        "trn_X_Y.txt (raw text + sparse labels), trn_X_Xf.txt + trn_X_Y.txt (split bag of words) or "
        f"train.txt / *_train.txt (bag of words); found {sorted(p.name for p in path.iterdir())}"
    )


def _find(directory: Path, names: tuple[str, ...]) -> Path | None:
    return next((directory / name for name in names if (directory / name).is_file()), None)


def _bow_file(directory: Path, split: str) -> Path | None:
    exact = directory / f"{split}.txt"
    if exact.is_file():
        return exact
    matches = sorted(p for p in directory.glob(f"*_{split}.txt") if not p.name.startswith("filter_labels_"))
    if len(matches) > 1:
        raise ValueError(f"several bag-of-words {split} files in {directory}: {[m.name for m in matches]}")
    return matches[0] if matches else None


def load_xmc_dataset(
    path: str | Path,
    *,
    format: Literal["auto", "json", "text_sparse", "bow", "bow_split"] = "auto",
    text_fields: TextFields = "title",
    add_label_texts: bool = False,
    return_features: bool = False,
    cache_dir: str | Path | None = None,
    label_text_share: LabelTextShare | None = None,
) -> XMCDataset:
    """Loads an Extreme Classification Repository dataset directory (train split required, test optional).

    Its splits' `labels` are label-id lists of different lengths: train on them with `HasteTrainer`, or give a stock
    `transformers.Trainer` `data_collator=XMCDataCollator(tokenizer)` (its own collators fail on them).

    Args:
        format: the layout; `"auto"` detects it (see `detect_format`).
        text_fields: for JSON data, `"title"` or `"title_content"` (`title + " " + content`).
        add_label_texts: append one training point per label, the label's own text with label set `[l]`.
            `train_label_frequencies` and `num_train_points` still describe the original training file.
        return_features: also read bag-of-words features into `XMCDataset.features` (BoW formats only).
        cache_dir: where `datasets` writes the Arrow files (default: the `datasets` cache).
        label_text_share: of the label count, the `[start, stop)` of the ids whose texts to read (a rank's share of
            a label-sharded run: `label_texts` is then a `LabelNameTable` of every label holding those), or None
            for all (`xmc_files.read_json_label_texts`).
    """
    path = Path(path)
    if format == "auto":
        format = detect_format(path)
    if return_features and format not in ("bow", "bow_split"):
        raise ValueError(f"return_features=True needs a bag-of-words dataset, {path} is {format!r}")
    if add_label_texts and label_text_share is not None:
        raise ValueError("add_label_texts=True adds a point of every label's text: it reads them all, not a share.")

    label_texts, splits, features = None, {}, {}
    if format == "json":
        label_file = _find(path, ("lbl.json.gz", "lbl.json"))
        if label_file is None:
            raise ValueError(f"{path} has trn.json[.gz] but no lbl.json[.gz] with the label texts")
        label_texts = read_json_label_texts(label_file, label_text_share)
        for split, prefix in _SPLIT_PREFIXES.items():
            source = _find(path, (f"{prefix}.json.gz", f"{prefix}.json"))
            if source is not None:
                splits[split] = read_json_split(
                    source, len(label_texts), text_fields=text_fields, split=split, cache_dir=cache_dir
                )
    else:
        for split, prefix in _SPLIT_PREFIXES.items():
            labels_file = path / f"{prefix}_X_Y.txt"
            if format == "text_sparse" and labels_file.is_file():
                splits[split] = read_text_split(path / f"{prefix}_X.txt", labels_file, split=split, cache_dir=cache_dir)
            elif format == "bow_split" and labels_file.is_file():
                splits[split] = read_sparse_label_split(labels_file, split=split, cache_dir=cache_dir)
                if return_features:
                    splits[split].features = read_sparse_features(path / f"{prefix}_X_Xf.txt")
            elif format == "bow" and _bow_file(path, split) is not None:
                splits[split] = read_bow_file(
                    _bow_file(path, split), return_features=return_features, split=split, cache_dir=cache_dir
                )
        if format == "text_sparse" and (path / "Y.txt").is_file():
            label_texts = read_label_texts(path / "Y.txt", label_text_share)
    if "train" not in splits:
        raise ValueError(f"no training split found in {path} for format {format!r}")

    label_count = splits["train"].label_count
    for split, item in splits.items():
        if item.label_count != label_count:
            raise ValueError(f"{path}: the {split} split declares {item.label_count} labels, train {label_count}")
        if item.features is not None:
            features[split] = item.features
            if item.features.shape[0] != len(item.dataset):
                raise ValueError(
                    f"{path}: {split} has {item.features.shape[0]} feature rows, {len(item.dataset)} labels"
                )
    if label_texts is not None and len(label_texts) != label_count:
        raise ValueError(f"{path}: {len(label_texts)} label texts for {label_count} labels")

    filters = {}
    for split in splits:
        filter_file = path / f"filter_labels_{split}.txt"
        if filter_file.is_file():
            filters[split] = read_filter_file(
                filter_file, num_points=len(splits[split].dataset), label_count=label_count
            )

    train = splits["train"].dataset
    frequencies = label_frequencies(train, label_count)
    num_train_points = len(train)
    if add_label_texts:
        if label_texts is None:
            raise ValueError(f"add_label_texts=True needs label texts, and {path} ({format}) has none")
        label_points = Dataset.from_dict(
            {"text": list(label_texts), "labels": [[label] for label in range(label_count)]}, features=TEXT_FEATURES
        )
        train = concatenate_datasets([train, label_points])

    return XMCDataset(
        splits=DatasetDict({"train": train, **{s: item.dataset for s, item in splits.items() if s != "train"}}),
        label_texts=label_texts,
        label_count=label_count,
        filters=filters,
        features=features,
        train_label_frequencies=frequencies,
        num_train_points=num_train_points,
        format=format,
    )


def demo_dataset_path() -> Path:
    """Directory of the small embedded demo dataset (`debian_tags_mini`, raw-text JSON format)."""
    return Path(__file__).resolve().parent / "demo_data" / "debian_tags_mini"


# ----------------------------------------------------------------------------------------------------------
# Collation


def pad_label_ids(
    label_lists: list[list[int]], pad_id: int = LABEL_PADDING_ID, label_count: int | None = None
) -> torch.Tensor:
    """Packs per-example positive label ids into an int64 `[B, P]` tensor, padded with `pad_id`.

    P is the largest number of positives in the batch, at least 1 (a batch of label-free points is `[B, 1]`
    of padding). Ids must be non-negative, and below `label_count` when it is given.
    """
    width = max(1, max((len(labels) for labels in label_lists), default=0))
    padded = torch.full((len(label_lists), width), pad_id, dtype=torch.long)
    for row, labels in enumerate(label_lists):
        if len(labels):
            padded[row, : len(labels)] = torch.as_tensor(labels, dtype=torch.long)
    ids = padded[padded != pad_id]
    if (ids < 0).any():
        raise ValueError("label ids must be non-negative")
    if label_count is not None and (ids >= label_count).any():
        raise ValueError(
            f"label id {int(ids.max())} is outside [0, label_count={label_count}): the data has more labels than "
            "the model; rebuild the model with the data's label count."
        )
    return padded


@dataclass
class LabelIdPadding:
    """Wraps a collator of token columns (e.g. `transformers.DataCollatorWithPadding`, which `HasteTrainer` wraps so)
    that cannot pad the ragged lists of positive label ids: lists of different lengths are packed as ids padded with
    -100 (`pad_label_ids`), and the other columns go to `collator`. Labels of one length (multi-hot rows, or as many
    ids in every example) go to `collator` with the rest, as they did. Text columns (strings) left beside the tokens
    (`HasteTrainingArguments` keeps every column, for `XMCDataCollator`) are not given to `collator`, which cannot
    batch them; examples without tokens are refused in one line that names `XMCDataCollator`."""

    collator: Any
    label_column: str = "labels"

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if "input_ids" not in features[0]:
            raise ValueError(
                f"{type(self.collator).__name__} pads tokenized examples, and these have no `input_ids` (columns: "
                f"{sorted(features[0])}): tokenize them first (`dataset.map(tokenizer)`), or pass "
                "`data_collator=haste_hf.XMCDataCollator(tokenizer)`, which tokenizes the text itself."
            )
        features = [{k: v for k, v in feature.items() if not isinstance(v, str)} for feature in features]
        labels = [feature.get(self.label_column) for feature in features]
        if not all(hasattr(row, "__len__") for row in labels) or len({len(row) for row in labels}) < 2:
            return self.collator(features)
        batch = self.collator([{k: v for k, v in feature.items() if k != self.label_column} for feature in features])
        batch["labels"] = pad_label_ids(labels)
        return batch


@dataclass
class XMCDataCollator:
    """Tokenizes the `text` column and packs `labels` as padded positive ids `[B, P]` (int64, -100 padding).

    The model expands the ids into its multi-hot targets, so a batch never holds a dense `[B, L]` tensor.
    Examples already tokenized (an `input_ids` column, e.g. from `dataset.map(lambda b: tokenizer(b["text"],
    truncation=True, max_length=...), batched=True)`) are padded as they are, never re-tokenized; one longer
    than `max_length` is refused rather than cut. To tokenize in the collator with `transformers.Trainer`, set
    `remove_unused_columns=False`: `text` is not a model argument and would otherwise be removed before it
    reaches the collator (HasteTrainingArguments does so).

    Args:
        tokenizer: any tokenizer of the encoder.
        max_length: texts are truncated to this many tokens.
        padding: passed to the tokenizer (`"longest"` pads to the batch's longest text, `"max_length"` to
            `max_length`).
        pad_to_multiple_of: passed to the tokenizer.
        label_count: the model's label count; ids at or above it are rejected here, on the CPU, so that the
            model need not check them on the GPU each step (which would synchronize the device).
    """

    tokenizer: PreTrainedTokenizerBase
    max_length: int = DEFAULT_MAX_LENGTH
    padding: bool | str = "longest"
    pad_to_multiple_of: int | None = None
    text_column: str = "text"
    label_column: str = "labels"
    label_count: int | None = None

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not features:
            raise ValueError("cannot collate an empty batch")
        if "input_ids" in features[0]:
            batch = self._pad_tokenized(features)
        elif self.text_column in features[0]:
            batch = self.tokenizer(
                [feature[self.text_column] for feature in features],
                max_length=self.max_length,
                truncation=True,
                padding=self.padding,
                pad_to_multiple_of=self.pad_to_multiple_of,
                return_tensors="pt",
            )
        else:
            raise KeyError(
                f"examples have neither a {self.text_column!r} column nor `input_ids` (keys: {sorted(features[0])}); "
                "with Trainer, set remove_unused_columns=False so the text reaches the collator"
            )
        if self.label_column in features[0]:
            batch["labels"] = pad_label_ids(
                [feature[self.label_column] for feature in features], label_count=self.label_count
            )
        return dict(batch)

    def _pad_tokenized(self, features: list[dict[str, Any]]):
        names = [name for name in self.tokenizer.model_input_names if name in features[0]]
        longest = max(range(len(features)), key=lambda row: len(features[row]["input_ids"]))
        if len(features[longest]["input_ids"]) > self.max_length:
            raise ValueError(
                f"a pre-tokenized example has {len(features[longest]['input_ids'])} tokens, more than the collator's "
                f"max_length={self.max_length}: tokenize with truncation=True, max_length={self.max_length}, or give "
                "XMCDataCollator a larger max_length"
            )
        return self.tokenizer.pad(
            [{name: feature[name] for name in names} for feature in features],
            padding=self.padding,
            max_length=self.max_length,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors="pt",
        )


__all__ = [
    "DATA_FORMATS",
    "XMCDataCollator",
    "XMCDataset",
    "XMCFormatError",
    "XMCSplit",
    "count_ids",
    "demo_dataset_path",
    "detect_format",
    "label_frequencies",
    "load_xmc_dataset",
    "pad_label_ids",
    "read_bow_file",
    "read_filter_file",
    "read_json_label_texts",
    "read_json_split",
    "read_label_texts",
    "read_sparse_features",
    "read_sparse_label_split",
    "read_text_split",
]
