# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Label names held compactly: one offsets vector and one byte buffer, not a Python string per label.

At 10^9 labels a list of names is about 80 GB of Python objects on every process that holds it (a string object of
some 70 bytes and a pointer per label), and its JSON takes minutes to write and read. `LabelNameTable` holds the
UTF-8 bytes of all names in one buffer and where each starts in an int64 vector (about 28 GB at 10^9 labels of
20-byte names, once; memory-mapped where read from files, so that the processes of one host share the pages) and
decodes a name when it is asked for. It is a read-only sequence of strings: `names[i]`, `len(names)`, iteration,
slices as lists. As a model's names, an empty name reads `LABEL_{id}`, as `HasteForExtremeClassification.set_label_names`
names it.

A table may hold the names of one range of ids only (`first_label`, `label_count`): the share of one rank of a
label-sharded run, which writes the names of that range and no other (a rank reads 1/W of a label file of 10^9 names,
not the ~34 GB of all). It has the length of all the labels; asked for a name it does not hold, it says so.

A label-sharded save (`haste_hf.training.shard_checkpoints`) writes the names in files of one rank each, the names of
a contiguous range of label ids per file (`model-label-names-0000r-of-0000W.safetensors`: an `offsets` I64 tensor of n + 1
entries from 0 and a `bytes` U8 tensor), listed in the output shards' index (`"label_names"`); `open_name_files`
maps them back as one table. Nothing in the files is trusted: shapes, offsets and the count are checked on opening,
the UTF-8 of a name when it is read.

Flat and Hub-exportable: imports only numpy and json.
"""

import bisect
import json
from collections.abc import Sequence

import numpy as np


LABEL_NAMES_FORMAT = "haste-label-names"
# Labels of one block that `first_difference` compares as bytes, and that the checks of a file read at a time.
_BLOCK = 1 << 22


def label_names_file(rank: int, world_size: int) -> str:
    # Named as weights (`model...safetensors`): a save that replaces the weights replaces these too.
    return f"model-label-names-{rank + 1:05d}-of-{world_size:05d}.safetensors"


class LabelNameTable(Sequence):
    """Names of consecutive label ids from pieces of `(offsets, data)` (numpy int64 `[n + 1]` from 0, uint8 bytes),
    each piece the names of the ids after the previous one's, the first of `first_label`; `source` names them in
    errors. `label_count`: the labels named (default: to the last held), of which the table holds `held`."""

    # Read by `configuration_haste.LabelNames` (which imports no sibling) to keep a table as it is.
    holds_names_compactly = True

    def __init__(
        self,
        pieces: list[tuple[np.ndarray, np.ndarray]],
        source: str = "label names",
        empty_as_id=False,
        first_label: int = 0,
        label_count: int | None = None,
    ):
        self.pieces, self.source, self.empty_as_id = pieces, source, empty_as_id
        self.starts = [first_label]
        for offsets, _ in pieces:
            self.starts.append(self.starts[-1] + len(offsets) - 1)
        self.label_count = self.starts[-1] if label_count is None else label_count
        if not 0 <= first_label <= self.starts[-1] <= self.label_count:
            raise ValueError(
                f"{source}: names of ids {first_label} to {self.starts[-1]} do not lie in {self.label_count} labels."
            )

    @property
    def held(self) -> tuple[int, int]:
        """`[start, stop)` of the ids whose names the table holds (all of them but in a rank's share)."""
        return self.starts[0], self.starts[-1]

    @classmethod
    def from_strings(cls, names) -> "LabelNameTable":
        encoded = [str(name).encode("utf-8") for name in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(name) for name in encoded], out=offsets[1:])
        return cls([(offsets, np.frombuffer(b"".join(encoded), dtype=np.uint8))])

    @classmethod
    def from_arrow(cls, strings, source: str = "label names", **window) -> "LabelNameTable":
        """The names of a pyarrow string array (chunked or not, no nulls), from its buffers: no string objects;
        `window`: `first_label` and `label_count` of a share."""
        pieces = []
        for chunk in getattr(strings, "chunks", [strings]):
            offset_type = np.int64 if str(chunk.type) == "large_string" else np.int32
            _, offset_buffer, data_buffer = chunk.buffers()
            offsets = np.frombuffer(offset_buffer, dtype=offset_type)[chunk.offset : chunk.offset + len(chunk) + 1]
            offsets = offsets.astype(np.int64)
            data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
            pieces.append((offsets - offsets[0], data[offsets[0] : offsets[-1]]))
        return cls(pieces, source, **window)

    def __len__(self) -> int:
        return self.label_count

    def __getitem__(self, label_id):
        if isinstance(label_id, slice):
            return [self[i] for i in range(*label_id.indices(len(self)))]
        label_id = int(label_id)
        if label_id < 0:
            label_id += len(self)
        if not 0 <= label_id < len(self):
            raise IndexError(f"label id {label_id} is outside the {len(self)} names.")
        self._check_held(label_id, label_id + 1)
        piece = bisect.bisect_right(self.starts, label_id) - 1
        offsets, data = self.pieces[piece]
        row = label_id - self.starts[piece]
        start, stop = int(offsets[row]), int(offsets[row + 1])
        try:
            name = bytes(data[start:stop]).decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.source}: the name of label {label_id} is not UTF-8 text.") from None
        return f"LABEL_{label_id}" if self.empty_as_id and not name.strip() else name

    def as_label_names(self) -> "LabelNameTable":
        """The same names, an empty one read as `LABEL_{id}` (a model's names; the data's label texts are as given)."""
        return LabelNameTable(self.pieces, self.source, True, self.starts[0], self.label_count)

    def _check_held(self, start: int, stop: int) -> None:
        if start < stop and not self.starts[0] <= start <= stop <= self.starts[-1]:
            raise ValueError(
                f"{self.source}: this process holds the names of labels {self.starts[0]:,} to {self.starts[-1]:,} of "
                f"{self.label_count:,} only (its share of a label-sharded run), not those of {start:,} to {stop:,}."
            )

    def __iter__(self):
        for start in range(0, len(self), _BLOCK):
            yield from self[start : min(start + _BLOCK, len(self))]

    def __eq__(self, other) -> bool:
        if not isinstance(other, (LabelNameTable, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and first_difference(self, other) is None

    __hash__ = None

    def __repr__(self) -> str:
        share = "" if self.held == (0, len(self)) else f", those of {self.held[0]} to {self.held[1]} held"
        return f"LabelNameTable({len(self)} names{share})"

    def byte_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """`(offsets from 0, bytes)` of the names of ids `[start, stop)`, views where one piece holds them."""
        self._check_held(start, stop)
        offsets, data = [np.zeros(1, dtype=np.int64)], []
        for piece, (piece_offsets, piece_data) in enumerate(self.pieces):
            low, high = max(start, self.starts[piece]), min(stop, self.starts[piece + 1])
            if low >= high:
                continue
            rows = piece_offsets[low - self.starts[piece] : high - self.starts[piece] + 1]
            offsets.append(rows[1:] - rows[0] + offsets[-1][-1])
            data.append(piece_data[rows[0] : rows[-1]])
        if len(data) == 1:
            return np.concatenate(offsets), data[0]
        return np.concatenate(offsets), (np.concatenate(data) if data else np.zeros(0, dtype=np.uint8))


def first_difference(names, other, within: tuple[int, int] | None = None) -> int | None:
    """The first label id whose name differs between `names` and `other` (sequences of names, tables or lists), the
    shorter's length where one is a prefix of the other, or None where they are equal. Two tables are compared block by
    block as bytes; only a block that differs is decoded (an empty name reads as `LABEL_{id}` in both). `within`:
    `[start, stop)`, the ids compared (a share's names; the lengths are compared still)."""
    count = min(len(names), len(other))
    low, high = (0, count) if within is None else (within[0], min(within[1], count))
    both_tables = isinstance(names, LabelNameTable) and isinstance(other, LabelNameTable)
    for start in range(low, high, _BLOCK):
        stop = min(start + _BLOCK, high)
        if both_tables and names.empty_as_id == other.empty_as_id:
            (ours, our_bytes), (theirs, their_bytes) = names.byte_range(start, stop), other.byte_range(start, stop)
            if np.array_equal(ours, theirs) and np.array_equal(our_bytes, their_bytes):
                continue
        for label_id, (name, theirs) in enumerate(zip(names[start:stop], other[start:stop]), start):
            if name != theirs:
                return label_id
    return None if len(names) == len(other) else count


def name_file_tensors(names, start: int, stop: int) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and metadata of the name file of ids `[start, stop)` of `names` (a table or a list)."""
    if isinstance(names, LabelNameTable):
        offsets, data = names.byte_range(start, stop)
    else:
        offsets, data = LabelNameTable.from_strings(names[start:stop]).byte_range(0, stop - start)
    return {"offsets": offsets, "bytes": data}, {"format": LABEL_NAMES_FORMAT, "first_label": str(start)}


def _mapped_tensor(path: str, header: dict, data_start: int, name: str, dtype, count_of) -> np.ndarray:
    entry = header.get(name)
    expected = {"offsets": "I64", "bytes": "U8"}[name]
    if not (isinstance(entry, dict) and entry.get("dtype") == expected and isinstance(entry.get("shape"), list)):
        raise ValueError(f"{path}: no {expected} tensor {name!r}: not a label names file; save the model again.")
    (begin, end), shape = entry.get("data_offsets", (0, -1)), entry["shape"]
    if len(shape) != 1 or end - begin != shape[0] * np.dtype(dtype).itemsize or count_of(shape[0]):
        raise ValueError(f"{path}: {name} has shape {shape} and {end - begin} bytes: save the model again.")
    if shape[0] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=(shape[0],))


def open_name_file(path: str, first_label: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`(offsets, bytes)` of one name file, memory-mapped, checked to hold the names of ids
    `[first_label, first_label + count)`: offsets from 0, never decreasing, ending at the bytes' length."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="np") as handle:  # checks the header and the data's extent
            metadata = handle.metadata() or {}
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is not a label names file ({error}): save the model again.") from None
    if metadata.get("format") != LABEL_NAMES_FORMAT or metadata.get("first_label") != str(first_label):
        raise ValueError(f"{path} is not the label names file of labels from {first_label}: save the model again.")
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    offsets = _mapped_tensor(path, header, 8 + length, "offsets", np.int64, lambda n: n != count + 1)
    data = _mapped_tensor(path, header, 8 + length, "bytes", np.uint8, lambda n: False)
    if offsets[0] != 0 or offsets[-1] != len(data):
        raise ValueError(f"{path}: its offsets run from {offsets[0]} to {offsets[-1]}, not 0 to {len(data)}.")
    for start in range(0, count, _BLOCK):
        if bool((np.diff(offsets[start : start + _BLOCK + 1]) < 0).any()):
            raise ValueError(f"{path}: its offsets decrease (labels {start} on): save the model again.")
    return offsets, data


def open_name_files(entries, label_count: int, path_of, source: str) -> LabelNameTable:
    """The table of the name files `entries` (the index's `label_names`: `{"file", "labels": [start, stop]}` in id
    order) covering `label_count` labels; `path_of(file)` is a file's local path."""
    expected, pieces = 0, []
    for entry in entries if isinstance(entries, list) else [None]:
        labels = entry.get("labels") if isinstance(entry, dict) else None
        valid = isinstance(labels, list) and len(labels) == 2 and all(type(n) is int for n in labels)
        if not valid or labels[0] != expected or labels[1] < labels[0]:
            raise ValueError(
                f"{source}: the label names files do not cover the labels in order at {expected} ({entry!r})."
            )
        pieces.append(open_name_file(path_of(entry.get("file")), labels[0], labels[1] - labels[0]))
        expected = labels[1]
    if expected != label_count:
        raise ValueError(
            f"{source}: the label names files name {expected} labels of {label_count}: save the model again."
        )
    return LabelNameTable(pieces, source, empty_as_id=True)


__all__ = [
    "LABEL_NAMES_FORMAT",
    "LabelNameTable",
    "first_difference",
    "label_names_file",
    "open_name_file",
    "name_file_tensors",
    "open_name_files",
]
