# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""A model folder whose output layer is saved in row shards, one file per rank of the run that saved it.

A label-sharded run (`haste_hf.training.sharded_output_layer`) cannot gather its output layer on one process at
10^9 labels (256 GB of bf16 tail weights alone). Each rank writes its rows of the row-sharded tensors (the head's
rows, the tail's groups, the labels of its groups for the tail bias; in a checkpoint, their optimizer state too)
to `model-output-0000r-of-0000W.safetensors`; `model.safetensors` holds every other tensor, and
`OUTPUT_SHARDS_INDEX` names the shard files in row order with the head rows and tail groups of each:

    {"format": "haste-output-shards", "version": 1, "group_size": G, "head_rows": H, "tail_groups": T,
     "tensors": {"output_layer.tail.weight": {"shape": [T, G, F]}, ...},
     "shards": [{"file": "model-output-00001-of-00002.safetensors", "head_rows": [0, h], "tail_groups": [0, t]},
                ...],
     "label_names": {"label_count": L, "files": [{"file": "label-names-00001-of-00002.safetensors", "labels": [0, l]},
                                                  ...]}}

The label names (where the model has any) are in files of one rank each too (`label_names`), not in one JSON.

`OutputShards` reads any rows of such a folder, shard by shard through safetensors' lazy slices: a rank of a run on
any number of ranks reads the rows it owns, one process reads them all (`from_pretrained`). Nothing in the index is
trusted: a file outside the folder, row ranges that overlap or leave a gap, a shard of the wrong shape are refused.

Flat and Hub-exportable: imports only torch, safetensors and transformers.
"""

import contextlib
import contextvars
import json
import os
import re

import torch
from transformers.utils import cached_file


OUTPUT_SHARDS_INDEX = "model-output.safetensors.index.json"
OUTPUT_SHARDS_FORMAT = "haste-output-shards"
# The output layer's tensors (by name in the layer) of which a sharded run's ranks hold rows.
ROW_SHARDED_TENSORS = ("head.weight", "head.bias", "tail.weight", "tail.bias", "tail.supports")
# A share's label ids (`output_labels` of its positions), in its shard as two tensors whose rows follow the head's
# and the tail slots' (as `tail.bias`); one process joins them into `output_labels`.
LABEL_ID_TENSORS = ("head.label_ids", "tail.label_ids")
# Names of optimizer state in the shards: `optimizer.<parameter's state-dict name>.<state key>`.
OPTIMIZER_PREFIX = "optimizer."


_TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_TORCH_DTYPES.update({"I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8})


def output_shard_file(rank: int, world_size: int) -> str:
    return f"model-output-{rank + 1:05d}-of-{world_size:05d}.safetensors"


def optimizer_entry_name(parameter_name: str, key: str) -> str:
    return f"{OPTIMIZER_PREFIX}{parameter_name}.{key}"


def _parameter_name(name: str) -> str:
    """The model tensor a shard tensor's rows follow: itself, or the parameter of an optimizer entry."""
    return name[len(OPTIMIZER_PREFIX) :].rpartition(".")[0] if name.startswith(OPTIMIZER_PREFIX) else name


def row_sharded_suffix(name: str) -> str | None:
    """The entry of `ROW_SHARDED_TENSORS` that the state-dict name `name` (or the optimizer entry of one) ends
    with, or None."""
    parameter = _parameter_name(name)
    return next(
        (suffix for suffix in (*ROW_SHARDED_TENSORS, *LABEL_ID_TENSORS) if parameter.endswith("." + suffix)), None
    )


def row_range(name: str, head_rows, tail_groups, group_size: int) -> tuple[int, int]:
    """Rows `[start, stop)` of the row-sharded tensor `name` that head rows `head_rows` and tail groups `tail_groups`
    make up: the head's, the groups', or the labels of the groups for the tail bias."""
    suffix = row_sharded_suffix(name)
    if suffix is None:
        raise KeyError(f"{name} is not a row-sharded tensor of the output layer.")
    if suffix.startswith("head."):
        return tuple(head_rows)
    scale = group_size if suffix in ("tail.bias", "tail.label_ids") else 1
    return tail_groups[0] * scale, tail_groups[1] * scale


def _is_row_pair(value) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 <= value[0] <= value[1]
    )


def is_plain_file_name(name) -> bool:
    """Whether `name` is a safetensors file name with no folder in it (nor a hidden one)."""
    return (
        isinstance(name, str)
        and name.endswith(".safetensors")
        and not name.startswith(".")
        and "/" not in name
        and "\\" not in name
        and os.sep not in name
    )


class OutputShards:
    """The row shards of the output layer of one saved folder (see the module's docstring), checked on opening;
    `read_rows` reads the rows of one tensor from the shards that hold them."""

    def __init__(self, index, source: str, path_of):
        self.source, self._path_of, self._handles = source, path_of, {}
        where = f"{source}: {OUTPUT_SHARDS_INDEX}"
        self._label_names = index.get("label_names") if isinstance(index, dict) else None
        if not (isinstance(index, dict) and index.get("format") == OUTPUT_SHARDS_FORMAT and index.get("version") == 1):
            raise ValueError(f"{where} is not a version-1 HASTE output-shards index: save the model again.")
        counts = [index.get(key) for key in ("group_size", "head_rows", "tail_groups")]
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) or counts[0] == 0:
            raise ValueError(f"{where} lacks a valid group_size, head_rows or tail_groups: save the model again.")
        self.group_size, head_count, group_count = counts
        tensors, shards = index.get("tensors"), index.get("shards")
        if not (isinstance(tensors, dict) and isinstance(shards, list) and shards):
            raise ValueError(f"{where} lists no tensors or no shard files: save the model again.")
        self.shapes = {}
        for name, entry in tensors.items():
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if row_sharded_suffix(name) is None or not (
                isinstance(shape, list) and shape and all(isinstance(n, int) and n >= 0 for n in shape)
            ):
                raise ValueError(f"{where}: {name!r} is no row-sharded tensor with a shape: save the model again.")
            whole = row_range(name, (0, head_count), (0, group_count), self.group_size)
            if shape[0] != whole[1]:
                raise ValueError(f"{where}: {name} has {shape[0]} rows where the index's counts give {whole[1]}.")
            self.shapes[name] = tuple(shape)
        self.shards, expected = [], {"head_rows": 0, "tail_groups": 0}
        for number, shard in enumerate(shards):
            if not isinstance(shard, dict) or not is_plain_file_name(shard.get("file")):
                raise ValueError(
                    f"{where}: shard {number} names no safetensors file of the folder itself ({shard!r}): an index "
                    "may name only files beside it; save the model again."
                )
            for key in expected:
                rows = shard.get(key)
                if not _is_row_pair(rows):
                    raise ValueError(f"{where}: shard {shard['file']} has no valid {key} range ({rows!r}).")
                if rows[0] != expected[key]:
                    problem = "overlap" if rows[0] < expected[key] else "leave a gap"
                    raise ValueError(
                        f"{where}: the {key} of shard {shard['file']} ({rows}) and the shard before it {problem} at "
                        f"{expected[key]}: the shards must cover the rows once, in order; save the model again."
                    )
                expected[key] = rows[1]
            self.shards.append(shard)
        if len({shard["file"] for shard in self.shards}) != len(self.shards):
            raise ValueError(f"{where} names a shard file twice: save the model again.")
        if (expected["head_rows"], expected["tail_groups"]) != (head_count, group_count):
            raise ValueError(
                f"{where}: the shards cover {expected['head_rows']} head rows and {expected['tail_groups']} tail groups "
                f"of {head_count} and {group_count}: shard files are missing; save the model again."
            )

    @classmethod
    def open(cls, folder, **hub_kwargs) -> "OutputShards | None":
        """The shards of `folder` (a local folder or a Hub id), None when it holds no `OUTPUT_SHARDS_INDEX`."""
        folder = os.fspath(folder)
        local = os.path.isdir(os.path.join(folder, hub_kwargs.get("subfolder") or ""))
        if local:
            root = os.path.join(folder, hub_kwargs.get("subfolder") or "")
            index_path = os.path.join(root, OUTPUT_SHARDS_INDEX)
            if not os.path.lexists(index_path):
                return None

            def path_of(name):
                path = os.path.join(root, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    kind = "a link" if os.path.islink(path) else "missing"
                    raise ValueError(f"{root}: the shard file {name} that {OUTPUT_SHARDS_INDEX} names is {kind}.")
                return path

            path_of(OUTPUT_SHARDS_INDEX)
        else:
            index_path = cached_file(
                folder,
                OUTPUT_SHARDS_INDEX,
                _raise_exceptions_for_missing_entries=False,
                _raise_exceptions_for_connection_errors=False,
                **hub_kwargs,
            )
            if index_path is None:
                return None

            def path_of(name):
                return cached_file(folder, name, **hub_kwargs)

        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
        except (UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"{folder}: {OUTPUT_SHARDS_INDEX} is not JSON ({error}): save the model again.") from None
        return cls(index, folder, path_of)

    def names(self) -> list[str]:
        return list(self.shapes)

    def has_label_names(self) -> bool:
        return self._label_names is not None

    def label_names(self, label_count: int | None = None):
        """The folder's label names (`label_names.LabelNameTable`, its files memory-mapped), None where the index
        lists no label names files (the names are then in `label_names.json`, or there are none). `label_count`: the
        model's, which the index must give (None: the index's own)."""
        from .label_names import open_name_files

        entry = self._label_names
        if entry is None:
            return None
        where = f"{self.source}: {OUTPUT_SHARDS_INDEX}"
        count = entry.get("label_count") if isinstance(entry, dict) else None
        if not (type(count) is int and count >= 0) or count != (count if label_count is None else label_count):
            raise ValueError(
                f"{where} names the labels of another label count than {label_count}: save the model again."
            )

        def path_of(name):
            if not is_plain_file_name(name):
                raise ValueError(f"{where} names {name!r}, not a safetensors file beside it: save the model again.")
            return self._path_of(name)

        return open_name_files(entry.get("files"), count, path_of, where)

    def dtype(self, name: str) -> torch.dtype:
        """The dtype of tensor `name`, as its first shard stores it."""
        shard = self.shards[0]
        stored = self._slice(shard, name, row_range(name, **self._ranges(shard))).get_dtype()
        if stored not in _TORCH_DTYPES:
            raise ValueError(
                f"{self.source}: the shard file {shard['file']} stores {name} as {stored}, not a weight dtype."
            )
        return _TORCH_DTYPES[stored]

    def _slice(self, shard: dict, name: str, rows: tuple[int, int]):
        from safetensors import SafetensorError, safe_open

        file = shard["file"]
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(self._path_of(file), framework="pt")
            except (SafetensorError, OSError) as error:
                raise ValueError(f"{self.source}: the shard file {file} does not load ({error}).") from None
        handle = self._handles[file]
        if name not in handle.keys():  # noqa: SIM118  (a safetensors handle has no `in`)
            raise ValueError(f"{self.source}: the shard file {file} holds no {name}: save the model again.")
        piece = handle.get_slice(name)
        expected = [rows[1] - rows[0], *self.shapes[name][1:]]
        if list(piece.get_shape()) != expected:
            raise ValueError(
                f"{self.source}: the shard file {file} holds {name} of shape {tuple(piece.get_shape())} where its rows "
                f"{list(rows)} need {tuple(expected)}: save the model again."
            )
        return piece

    def _ranges(self, shard: dict) -> dict:
        return {"head_rows": shard["head_rows"], "tail_groups": shard["tail_groups"], "group_size": self.group_size}

    def read_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows `[start, stop)` of tensor `name`, read only from the shards that hold them."""
        if name not in self.shapes:
            raise ValueError(f"{self.source}: {OUTPUT_SHARDS_INDEX} lists no tensor {name}.")
        if not 0 <= start <= stop <= self.shapes[name][0]:
            raise ValueError(f"{self.source}: rows [{start}, {stop}) of {name} are outside its {self.shapes[name][0]}.")
        pieces = []
        for shard in self.shards:
            rows = row_range(name, **self._ranges(shard))
            low, high = max(start, rows[0]), min(stop, rows[1])
            if low < high:
                pieces.append(self._slice(shard, name, rows)[low - rows[0] : high - rows[0]])
        if not pieces:  # no rows: an empty read of the first shard, for the dtype
            shard = self.shards[0]
            pieces.append(self._slice(shard, name, row_range(name, **self._ranges(shard)))[0:0])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def output_labels(self, prefix: str, shape, rows=None) -> torch.Tensor:
        """The `output_labels` of the layer under `prefix` from its parts in the shards: all of them, or the head rows
        and tail groups `rows` (`{"head_rows": ..., "tail_groups": ...}`) of one share."""
        head, tail = (prefix + name for name in LABEL_ID_TENSORS)
        if tail not in self.shapes:
            raise ValueError(f"{self.source}: {OUTPUT_SHARDS_INDEX} lists {head} without {tail}: save the model again.")
        parts = [
            self.read_rows(
                name, *(row_range(name, **rows, group_size=self.group_size) if rows else (0, self.shapes[name][0]))
            )
            for name in (head, tail)
        ]
        labels = torch.cat(parts)
        if tuple(labels.shape) != tuple(shape):
            raise ValueError(
                f"{self.source}: the shards hold {labels.numel()} label ids where the model's configuration makes "
                f"{tuple(shape)}: the folder's files do not belong together."
            )
        return labels

    def close(self) -> None:
        self._handles.clear()

    @torch.no_grad()
    def load_into_(self, model) -> set[str]:
        """Copies into `model` (a whole one, in one process) every tensor of its state dict that the shards hold;
        returns their names."""
        state = model.state_dict()
        loaded = set()
        for name in self.names():
            if name.endswith("." + LABEL_ID_TENSORS[0]):  # with its tail part, the layer's `output_labels`
                target = name[: -len(LABEL_ID_TENSORS[0])] + "output_labels"
                state[target].copy_(self.output_labels(name[: -len(LABEL_ID_TENSORS[0])], state[target].shape))
                loaded.add(target)
            if name not in state:
                continue
            value = self.read_rows(name, 0, self.shapes[name][0])
            if tuple(value.shape) != tuple(state[name].shape):
                raise ValueError(
                    f"{self.source}: the shards hold {name} of shape {tuple(value.shape)} where the model's "
                    f"configuration makes it {tuple(state[name].shape)}: the folder's files do not belong together."
                )
            state[name].copy_(value)
            loaded.add(name)
        self.close()
        return loaded


# While `from_pretrained` loads the other weights of a folder with row shards: (regular expressions of) the names of
# the tensors the shards hold, which the model tells transformers not to report missing
# (`_keys_to_ignore_on_load_missing`, read by `HasteForExtremeClassification.__init__`).
NAMES_IN_SHARDS = contextvars.ContextVar("haste_names_in_shards", default=frozenset())


@contextlib.contextmanager
def loading_with_shards(shards: "OutputShards | None"):
    """Within the block, new models leave the tensors `shards` holds out of transformers' missing-weights report."""
    held = [] if shards is None else shards.names()
    held += [name[: -len(LABEL_ID_TENSORS[0])] + "output_labels" for name in held if name.endswith(LABEL_ID_TENSORS[0])]
    names = frozenset(f"^{re.escape(name)}$" for name in held)
    token = NAMES_IN_SHARDS.set(names)
    try:
        yield
    finally:
        NAMES_IN_SHARDS.reset(token)


__all__ = [
    "LABEL_ID_TENSORS",
    "NAMES_IN_SHARDS",
    "OPTIMIZER_PREFIX",
    "OUTPUT_SHARDS_FORMAT",
    "OUTPUT_SHARDS_INDEX",
    "ROW_SHARDED_TENSORS",
    "OutputShards",
    "is_plain_file_name",
    "loading_with_shards",
    "optimizer_entry_name",
    "output_shard_file",
    "row_range",
    "row_sharded_suffix",
]
