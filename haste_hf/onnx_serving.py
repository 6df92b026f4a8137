# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Serving a HASTE model exported by `haste_hf.export.export_onnx` with onnxruntime, without torch.

An export folder holds one of two layouts (`haste_onnx.json` says which):

- ``single``: `model.onnx` maps `input_ids`, `attention_mask` `[batch, sequence]` to the top-k `label_ids` and
  their `scores` (sigmoid probabilities) `[batch, k]`: encoder, pooling, head, tail and top-k in one graph.
- ``split`` (an output layer too large for one ONNX file): `encoder.onnx` maps the same inputs to the inputs of
  the output layer (`head_features`, `tail_features`), and `output_layer.safetensors` holds the output layer,
  scored here in numpy a chunk of labels at a time, so memory stays `O(batch * (k + chunk))`.

`OnnxClassifier` serves both. This file is flat and imports only numpy and onnxruntime (and transformers for
`predict`'s tokenizer; never torch): the export copies it beside the model as `haste_onnx.py`.
"""

import hashlib
import json
import numbers
import os
import stat
import tempfile
import warnings

import numpy as np


METADATA_FILE = "haste_onnx.json"
LABEL_NAMES_FILE = "label_names.json"
LAYOUTS = ("single", "split")
# The names `haste_hf.saving` gives the mark of an unfinished save (its journal), the id of each save and the prefix
# of its staging folders (this file imports nothing of haste_hf): an export is written as a model folder is.
INCOMPLETE_SAVE_FILE = ".haste-save-incomplete"
SAVE_GENERATION_FILE = ".haste-save-generation"
STAGING_PREFIX = ".haste-staging-"
# Files serving does not read, left out of the metadata's `files`: the metadata itself, the README and this code.
UNLISTED_FILES = (METADATA_FILE, "README.md", "haste_onnx.py")
# Logits scored at once by the split layout's top-k (`[batch, chunk]` fp32 block).
TOPK_CHUNK_ELEMENTS = 1 << 24
_SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` largest `scores [B, n]` of each row and their columns, best first."""
    k = min(k, scores.shape[1])
    columns = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    best = np.take_along_axis(scores, columns, axis=1)
    order = np.argsort(-best, axis=1, kind="stable")
    return np.take_along_axis(best, order, axis=1), np.take_along_axis(columns, order, axis=1)


def merge_topk(best, candidates, k: int):
    """The `k` best of two (scores `[B, *]`, ids `[B, *]`) sets, best first."""
    scores, top = topk(np.concatenate([best[0], candidates[0]], axis=1), k)
    return scores, np.take_along_axis(np.concatenate([best[1], candidates[1]], axis=1), top, axis=1)


def output_layer_topk(weights: dict, head_x, tail_x, k: int, chunk_elements: int = TOPK_CHUNK_ELEMENTS):
    """The `k` best (logits, label ids) of each row from the output layer's inputs, without `[B, L]` logits.

    Args:
        weights: the arrays of `output_layer.safetensors`: `head.weight [H, d_h]`, `head.bias [H]` (when the model
            has a head), `tail.weight [K, G, F]`, `tail.supports [K, F]`, `tail.bias [K * G]` (when it has a tail and
            tail biases), and `output_labels [H + K * G]` (the label id of each output position, -1 for padding).
        head_x: `[B, d_h]` float32, the `head_features` output of `encoder.onnx` (None without a head).
        tail_x: `[B, d_t]` float32, its `tail_features` (None without a tail).
    """
    output_labels = weights["output_labels"]
    reference = head_x if head_x is not None else tail_x
    batch_size = reference.shape[0]
    best = (np.empty((batch_size, 0), np.float32), np.empty((batch_size, 0), np.int64))
    head_count = 0
    if "head.weight" in weights:
        head_weight, head_bias = weights["head.weight"], weights.get("head.bias")
        head_count = head_weight.shape[0]
        step = max(1, chunk_elements // max(1, batch_size))
        for start in range(0, head_count, step):
            stop = min(start + step, head_count)
            logits = head_x @ head_weight[start:stop].T
            if head_bias is not None:
                logits += head_bias[start:stop]
            best = merge_topk(best, _masked_topk(logits, output_labels, start, k), k)
    if "tail.weight" in weights:
        tail_weight, supports, tail_bias = weights["tail.weight"], weights["tail.supports"], weights.get("tail.bias")
        group_count, group_size, fan_in = tail_weight.shape
        # Per group: the gathered `[B, F]` features and the `[B, G]` logits.
        step = max(1, chunk_elements // max(1, batch_size * (fan_in + group_size)))
        for start in range(0, group_count, step):
            stop = min(start + step, group_count)
            gathered = tail_x[:, supports[start:stop]].transpose(1, 0, 2)  # [k, B, F]
            logits = np.matmul(gathered, tail_weight[start:stop].transpose(0, 2, 1))  # [k, B, G]
            logits = logits.transpose(1, 0, 2).reshape(batch_size, -1)
            if tail_bias is not None:
                logits += tail_bias[start * group_size : stop * group_size]
            best = merge_topk(best, _masked_topk(logits, output_labels, head_count + start * group_size, k), k)
    scores, positions = best
    return scores, output_labels[positions]


def _masked_topk(logits, output_labels, first_position: int, k: int):
    """Top-k (logits, output positions) of a block whose first column is `first_position`; padding never wins."""
    padding = output_labels[first_position : first_position + logits.shape[1]] < 0
    if padding.any():
        logits = np.where(padding, -np.inf, logits).astype(np.float32)
    scores, columns = topk(logits, k)
    return scores, columns + first_position


def safetensors_views(data: bytes, path: str) -> dict[str, np.ndarray]:
    """Safetensors bytes as read-only numpy views onto them (`safetensors.numpy.load` copies: 2x the memory)."""
    try:
        (header := json.loads(data[8 : 8 + (size := int.from_bytes(data[:8], "little"))])).pop("__metadata__", None)
        body, arrays = memoryview(data)[8 + size :], {}
        for name, entry in header.items():
            start, stop = entry["data_offsets"]
            if not (0 <= start <= stop <= len(body) and min(entry["shape"], default=0) >= 0):
                raise ValueError(f"tensor {name!r} lies outside the data")
            arrays[name] = np.frombuffer(body[start:stop], _SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])
        return arrays
    except (AttributeError, TypeError, KeyError, ValueError) as error:
        raise ExportError(f"{path} is not a whole safetensors file ({error}): export the model again.") from None


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return (0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32)  # exp-free: no overflow warnings at +-inf


class ExportError(ValueError):
    """An export folder that does not hold one whole export: a file damaged, missing, replaced or of another export."""


class OnnxClassifier:
    """The top-k labels of texts from an exported HASTE model, on onnxruntime.

        classifier = OnnxClassifier("exported")
        label_ids, scores = classifier.top_k(input_ids, attention_mask)   # int64 arrays [batch, sequence]
        classifier.predict(["a text", "another"])   # [[{"label": ..., "score": ...}, ...], ...]

    Scores are sigmoid probabilities. `providers` and `session_options` go to `onnxruntime.InferenceSession`.

    Nothing the folder holds is trusted: `haste_onnx.json` names every file the export wrote with its size and sha256
    digest, and a folder that disagrees (a file damaged, missing, of another export, or replaced while it loads), that
    holds the mark of an interrupted export, or whose files contradict each other (label names, label count, the
    graph's outputs, the output layer's shapes and label ids) is refused with an `ExportError` naming the file.
    Exports of versions that recorded no files are served after the checks that need no digests, with a warning.

    An export stopped while it switched its files in (killed after its journal was written) is served whole as the new
    export: each file its journal names is read from the staging folder where it is not moved in yet; the folder is
    not written (the next export into it finishes the switch). Stopped before, the folder holds the old export whole.
    """

    def __init__(self, folder, providers=("CPUExecutionProvider",), session_options=None):
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(
                "Serving an ONNX export needs onnxruntime: pip install onnxruntime (or 'haste_hf[export]')"
            ) from None

        self.folder = os.fspath(folder)
        generation, self._staging, self._moving = self._generation()
        self.metadata = self._read_metadata()
        self.layout = self.metadata["layout"]
        self.top_k_default = self.metadata["top_k"]
        self.label_count = self.metadata["label_count"]
        self.max_positions = self.metadata.get("max_positions")
        files = self.metadata.get("files")
        # Each file read once, checked, and served from the bytes checked: a file replaced after its check is not read.
        self._contents = None
        if files is None and self._moving:
            raise ExportError(
                f"{self._path(INCOMPLETE_SAVE_FILE)} is present: an export to {self.folder} was interrupted, and "
                f"{METADATA_FILE} records no files to serve it whole by. Export the model again."
            )
        if files is None:
            warnings.warn(
                f"{self._path(METADATA_FILE)} names no files (an export of an earlier haste_hf): the checks that need "
                "their digests are skipped, so a file of another export would go unnoticed. Export the model again.",
                stacklevel=2,
            )
        else:
            self._contents = self._read_files(files)
        self.session = self._session(onnxruntime, session_options, providers)
        self.output_layer = None
        if self.layout == "split":
            name = self.metadata["output_layer_file"]
            self.output_layer = safetensors_views(self._content(name), self._path(name))
        self.label_names = self._read_label_names()
        if self._contents is not None:  # the graph's and the output layer's bytes are loaded: only the tokenizer's kept
            graphs = tuple(self.metadata[key] for key in _graph_keys(self.metadata))
            self._contents = {name: data for name, data in self._contents.items() if not name.startswith(graphs)}
        if self._generation()[0] != generation:
            raise ExportError(f"{self.folder} was exported to again while it loaded: load it again.")
        self._check_graph()
        if self.output_layer is not None:
            self._check_output_layer()
        self._tokenizer = None

    # ------------------------------------------------------------------------------------ what the folder holds

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def _generation(self):
        """(the export's save id (None before exports wrote one), the staging folder and the files named by the journal
        of an export stopped in its switch); refuses a journal that names no staging folder there."""
        journal = _read_mark(self._path(INCOMPLETE_SAVE_FILE))
        if journal is not None:
            staging, files = journal.get("staging"), journal.get("files")
            if not (
                _is_plain_name(staging)
                and staging.startswith(STAGING_PREFIX)
                and isinstance(journal.get("generation"), str)
                and isinstance(files, list)
                and all(map(_is_plain_name, files))
                and os.path.isdir(self._path(staging))
                and not os.path.islink(self._path(staging))
            ):
                raise ExportError(
                    f"{self._path(INCOMPLETE_SAVE_FILE)} is present: an export to {self.folder} was interrupted and "
                    "cannot be finished, so its files may mix two exports. Export the model again."
                )
            return journal["generation"], self._path(staging), frozenset(files)
        generation = _read_mark(self._path(SAVE_GENERATION_FILE))
        return (generation.get("generation") if generation is not None else None), None, frozenset()

    def _sources(self, name: str) -> list[str]:
        """Where a file of the export is read: in the staging folder of a switch that was stopped, until moved in."""
        return [os.path.join(self._staging, name), self._path(name)] if name in self._moving else [self._path(name)]

    def _open(self, name: str, flags: int = 0):
        """A binary file object of the export's file `name` (see `_sources`), opened without following a link;
        raises `FileNotFoundError` when it is nowhere, `ExportError` when it is a link or not a regular file."""
        for source in self._sources(name):
            try:
                if not stat.S_ISREG(os.lstat(source).st_mode):  # checked first: opening a FIFO would wait
                    raise ExportError(f"{source} is a link or not a regular file: an export holds its own files.")
                return open(os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | flags), "rb")
            except FileNotFoundError:
                continue  # moved in from the staging folder meanwhile: read where it went
        raise FileNotFoundError(self._path(name))

    def _read_metadata(self) -> dict:
        path = self._path(METADATA_FILE)
        try:
            with self._open(METADATA_FILE) as f:
                metadata = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise ExportError(
                f"{self.folder} holds no {METADATA_FILE}: give the folder `haste-hf export` wrote."
            ) from None
        except ValueError as error:
            raise ExportError(f"{path} is unreadable ({error}): export the model again.") from None

        def refuse(what: str):
            raise ExportError(f"{path} is damaged: {what}. Export the model again.")

        if not isinstance(metadata, dict):
            refuse("it holds no object")
        if metadata.get("layout") not in LAYOUTS:
            refuse(f"its `layout` is {metadata.get('layout')!r}, not one of {LAYOUTS}")
        label_count, top_k = metadata.get("label_count"), metadata.get("top_k")
        if not _is_count(label_count):
            refuse(f"its `label_count` is {label_count!r}")
        if not (_is_count(top_k) and top_k <= label_count):
            refuse(f"its `top_k` is {top_k!r}, not an integer in [1, label_count={label_count}]")
        if metadata.get("max_positions") is not None and not _is_count(metadata["max_positions"]):
            refuse(f"its `max_positions` is {metadata['max_positions']!r}")
        for key in _graph_keys(metadata):
            if not _is_plain_file_name(metadata.get(key)):
                refuse(f"its `{key}` is {metadata.get(key)!r}, not the name of a file of the folder")
        files = metadata.get("files")
        if files is not None:
            if not isinstance(files, dict) or not all(
                _is_plain_file_name(name)
                and isinstance(entry, dict)
                and _is_count(entry.get("bytes"), minimum=0)
                and isinstance(entry.get("sha256"), str)
                for name, entry in files.items()
            ):
                refuse("its `files` is not a {name: {bytes, sha256}} object")
            for key in _graph_keys(metadata):
                if metadata[key] not in files:
                    refuse(f"its `{key}` ({metadata[key]}) is not one of its `files`")
        return metadata

    def _read_files(self, files: dict) -> dict[str, bytes]:
        """The bytes of each file the metadata names, read once and checked against its size and digest (links and
        other non-regular files refused); label names present must be one of them, and other unlisted files, which
        serving never reads, are named in a warning."""
        contents = {}
        for name, expected in files.items():
            path = self._path(name)
            try:
                with self._open(name, getattr(os, "O_NONBLOCK", 0)) as f:
                    content = f.read()
            except FileNotFoundError:
                raise ExportError(f"{path} is missing: {METADATA_FILE} names it. Export the model again.") from None
            if len(content) != expected["bytes"]:
                raise ExportError(
                    f"{path} is {len(content)} bytes where {METADATA_FILE} says {expected['bytes']}: it is damaged or "
                    "of another export. Export the model again."
                )
            if hashlib.sha256(content).hexdigest() != expected["sha256"]:
                raise ExportError(
                    f"{path} is not the file the export wrote (its sha256 differs from the one {METADATA_FILE} "
                    "records): it is damaged or of another export. Export the model again."
                )
            contents[name] = content
        if os.path.lexists(self._path(LABEL_NAMES_FILE)) and LABEL_NAMES_FILE not in files:
            raise ExportError(
                f"{self._path(LABEL_NAMES_FILE)} is not one of the export's files ({METADATA_FILE} names none): remove "
                "it, or export the model with its label names."
            )
        unlisted = sorted(
            name
            for name in os.listdir(self.folder)
            if name not in files and name not in UNLISTED_FILES and not name.startswith(".")
        )
        if unlisted:
            warnings.warn(
                f"{self.folder} holds files the export did not write, which serving ignores: {', '.join(unlisted)}.",
                stacklevel=3,
            )
        return contents

    def _content(self, name: str) -> bytes:
        """A file's checked bytes (read now from an export that recorded no digests)."""
        if self._contents is not None:
            return self._contents[name]
        try:
            with self._open(name) as f:
                return f.read()
        except FileNotFoundError:
            raise ExportError(
                f"{self._path(name)} is missing: {METADATA_FILE} names it. Export the model again."
            ) from None

    def _session(self, onnxruntime, session_options, providers):
        """The graph's session, from the checked bytes; a graph with its weights in files beside it is loaded from a
        private copy of the checked files."""
        model_file = self.metadata["model_file"]
        beside = [name for name in (self._contents or {}) if name.startswith(model_file) and name != model_file]
        if self._contents is None or not beside:
            return onnxruntime.InferenceSession(
                self._content(model_file), sess_options=session_options, providers=list(providers)
            )
        with tempfile.TemporaryDirectory() as private:
            for name in (model_file, *beside):
                with open(os.path.join(private, name), "wb") as f:
                    f.write(self._contents[name])
            return onnxruntime.InferenceSession(
                os.path.join(private, model_file), sess_options=session_options, providers=list(providers)
            )

    def _read_label_names(self):
        path = self._path(LABEL_NAMES_FILE)
        listed = self._contents is not None and LABEL_NAMES_FILE in self._contents
        if not listed and not (self._contents is None and os.path.isfile(path)):
            return None
        try:
            names = json.loads(self._content(LABEL_NAMES_FILE).decode("utf-8"))
        except ValueError as error:
            raise ExportError(f"{path} is unreadable ({error}): export the model again.") from None
        if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
            raise ExportError(f"{path} is not a list of label names: export the model again.")
        if len(names) != self.label_count:
            raise ExportError(
                f"{path} holds {len(names)} names for the export's {self.label_count} labels: it is of another "
                "export. Export the model again."
            )
        return names

    def _check_graph(self) -> None:
        """The graph takes `input_ids` and `attention_mask` and gives what the layout reads."""
        path = self._path(self.metadata["model_file"])
        inputs = {node.name for node in self.session.get_inputs()}
        outputs = {node.name: node.shape for node in self.session.get_outputs()}
        if not {"input_ids", "attention_mask"} <= inputs:
            raise ExportError(
                f"{path} does not take `input_ids` and `attention_mask`: it is not a HASTE export's graph."
            )
        if self.layout == "single":
            if not {"label_ids", "scores"} <= set(outputs):
                raise ExportError(f"{path} gives no `label_ids` and `scores`: it is not a single-graph HASTE export.")
            width = outputs["label_ids"][-1] if len(outputs["label_ids"]) == 2 else None
            if isinstance(width, int) and width != self.top_k_default:
                raise ExportError(
                    f"{path} gives the top {width} labels where {METADATA_FILE} says {self.top_k_default}: the two are "
                    "of different exports. Export the model again."
                )
        elif not {"head_features", "tail_features"} & set(outputs):
            raise ExportError(f"{path} gives no `head_features` or `tail_features`: it is not a HASTE encoder graph.")

    def _check_output_layer(self) -> None:
        """The split layout's output layer gives each of the `label_count` labels one position, with shapes that agree
        with each other and with the graph's features."""
        path = self._path(self.metadata["output_layer_file"])
        weights, label_count = self.output_layer, self.label_count
        widths = {node.name: node.shape[-1] for node in self.session.get_outputs()}

        def refuse(what: str):
            raise ExportError(f"{path} {what}: it is damaged or of another export. Export the model again.")

        def check_width(name: str, width: int):
            if name not in widths:
                refuse(f"scores `{name}`, which the graph does not give")
            if isinstance(widths[name], int) and widths[name] != width:
                refuse(f"reads {width} `{name}` where the graph gives {widths[name]}")

        output_labels = weights.get("output_labels")
        if output_labels is None or output_labels.ndim != 1 or output_labels.dtype.kind not in "iu":
            refuse("holds no `output_labels` vector of label ids")
        positions = 0
        if "head.weight" in weights:
            head = weights["head.weight"]
            if head.ndim != 2 or weights.get("head.bias", np.zeros(head.shape[0])).shape != (head.shape[0],):
                refuse("holds a head of inconsistent shapes")
            check_width("head_features", head.shape[1])
            positions += head.shape[0]
        if "tail.weight" in weights:
            tail, supports = weights["tail.weight"], weights.get("tail.supports")
            if tail.ndim != 3 or supports is None or supports.shape != (tail.shape[0], tail.shape[2]):
                refuse("holds a tail of inconsistent shapes")
            tail_positions = tail.shape[0] * tail.shape[1]
            if weights.get("tail.bias", np.zeros(tail_positions)).shape != (tail_positions,):
                refuse("holds a tail bias of the wrong length")
            if "tail_features" not in widths:
                refuse("scores `tail_features`, which the graph does not give")
            width = widths["tail_features"]
            if supports.size and (supports.min() < 0 or (isinstance(width, int) and supports.max() >= width)):
                refuse(f"holds tail supports outside the graph's {width} `tail_features`")
            positions += tail_positions
        if output_labels.shape[0] != positions:
            refuse(f"maps {output_labels.shape[0]} output positions where its head and tail have {positions}")
        real = output_labels[output_labels >= 0]
        if (
            output_labels.min(initial=0) < -1
            or real.size != label_count
            or not np.array_equal(np.bincount(real, minlength=label_count), np.ones(label_count, np.int64))
        ):
            refuse(f"does not give each of the {label_count} labels one output position")

    # ----------------------------------------------------------------------------------------------- serving

    def top_k(self, input_ids, attention_mask, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(label_ids, scores)`, each `[batch, k]`, best first. `k` defaults to the export's; a single-graph export
        computes that many, so a smaller `k` is a slice of them and a larger one is refused. Rows longer than the
        encoder's positions are refused (`predict` truncates texts); an empty batch gives `[0, k]` arrays."""
        k = self._checked_k(k)
        inputs = {
            "input_ids": _token_array(input_ids, "input_ids"),
            "attention_mask": _token_array(attention_mask, "attention_mask"),
        }
        if inputs["input_ids"].shape != inputs["attention_mask"].shape:
            raise ValueError(
                f"`input_ids` {inputs['input_ids'].shape} and `attention_mask` {inputs['attention_mask'].shape} must "
                "have one shape."
            )
        batch_size, length = inputs["input_ids"].shape
        if batch_size == 0:
            return np.empty((0, k), np.int64), np.empty((0, k), np.float32)
        if length == 0:
            raise ValueError("`input_ids` has rows of no token: give at least one token per row.")
        if self.max_positions is not None and length > self.max_positions:
            raise ValueError(
                f"`input_ids` has rows of {length} tokens; the encoder reads at most {self.max_positions}: truncate "
                "them (`predict` does)."
            )
        outputs = dict(zip([output.name for output in self.session.get_outputs()], self.session.run(None, inputs)))
        if self.layout == "single":
            label_ids, scores = outputs["label_ids"][:, :k], outputs["scores"][:, :k]
        else:
            logits, label_ids = output_layer_topk(
                self.output_layer, outputs.get("head_features"), outputs.get("tail_features"), k
            )
            scores = sigmoid(logits)
        if label_ids.size and (label_ids.min() < 0 or label_ids.max() >= self.label_count):
            raise ExportError(
                f"{self._path(self.metadata['model_file'])} gave label ids outside [0, {self.label_count}): it is not "
                "the graph of this export. Export the model again."
            )
        return label_ids, scores

    def _checked_k(self, k) -> int:
        k = self.top_k_default if k is None else k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 1 <= k <= self.label_count:
            raise ValueError(f"`k` must be an integer in [1, label_count={self.label_count}], got {k!r}.")
        if self.layout == "single" and k > self.top_k_default:
            raise ValueError(
                f"This export computes the top {self.top_k_default} labels in its graph; `k={k}` needs an export "
                f"with a larger top-k (`haste-hf export -k {k}`)."
            )
        return int(k)

    def predict(self, texts: list[str], k: int | None = None) -> list[list[dict]]:
        """The `k` best `{"label", "score"}` of each text, tokenized by the exported tokenizer (cut at its
        `model_max_length`, the length the model was trained on, and at the encoder's positions); `[]` for no text."""
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"`texts` must be a list of strings (one text: [text]), got {_shown(texts)}.")
        k = self._checked_k(k)
        if not texts:
            return []
        tokenizer = self._load_tokenizer()
        # Cut at the tokenizer's length and at the encoder's positions (exports of earlier versions name none).
        limit = {"max_length": min(tokenizer.model_max_length, self.max_positions)} if self.max_positions else {}
        batch = tokenizer(list(texts), truncation=True, padding=True, return_tensors="np", **limit)
        label_ids, scores = self.top_k(batch["input_ids"], batch["attention_mask"], k)
        names = self.label_names
        return [
            [
                {"label": names[i] if names is not None else f"LABEL_{i}", "score": float(s)}
                for i, s in zip(row_ids, row_scores)
            ]
            for row_ids, row_scores in zip(label_ids.tolist(), scores)
        ]

    def _load_tokenizer(self):
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise ImportError(
                    "`predict` tokenizes texts with the export's tokenizer through transformers (torch not needed): "
                    "pip install transformers, or tokenize the texts yourself and call `top_k(input_ids, attention_mask)`."
                ) from None

            if self._contents is None:
                self._tokenizer = AutoTokenizer.from_pretrained(self.folder)
            else:  # from a private copy of the checked files: a tokenizer file the export did not write (an added
                # special_tokens_map.json changed every prediction), or one replaced since, is never read
                with tempfile.TemporaryDirectory() as private:
                    for name, content in self._contents.items():
                        with open(os.path.join(private, name), "wb") as f:
                            f.write(content)
                    self._tokenizer = AutoTokenizer.from_pretrained(private)
        return self._tokenizer


def _graph_keys(metadata: dict) -> list[str]:
    """The metadata's keys that name the graph and, in the split layout, the output layer."""
    return ["model_file"] + (["output_layer_file"] if metadata["layout"] == "split" else [])


def _token_array(values, name: str) -> np.ndarray:
    if values is None:
        raise ValueError(f"`{name}` is None: give a [batch, sequence] array of integers.")
    array = np.asarray(values)
    if array.ndim != 2 or not (array.dtype.kind in "iu" or array.size == 0):
        raise ValueError(
            f"`{name}` must be a [batch, sequence] array of integers, got shape {array.shape} of {array.dtype}."
        )
    return array.astype(np.int64)


def _is_count(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _read_mark(path: str) -> dict | None:
    """The JSON object of the mark `path` (None when there is none), read only as a small regular file, without
    following a link: a FIFO there would block the load forever, a device (`/dev/zero`) fill the memory."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ExportError(
            f"{path} cannot be read ({error.strerror}): remove it, then export the model again."
        ) from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 1 << 20:
            raise ExportError(f"{path} is not a mark an export wrote: remove it, then export the model again.")
        content = os.read(handle, info.st_size + 1)
    finally:
        os.close(handle)
    try:
        mark = json.loads(content.decode("utf-8"))
    except ValueError:
        mark = None
    if not isinstance(mark, dict):
        raise ExportError(f"{path} is damaged: remove it, then export the model again.")
    return mark


def _is_plain_name(name) -> bool:
    """A name directly inside the folder (hidden ones included: the staging folder's)."""
    return isinstance(name, str) and name == os.path.basename(name) and name not in ("", ".", "..")


def _is_plain_file_name(name) -> bool:
    """A file directly inside the folder: no path, no parent, no hidden name."""
    return _is_plain_name(name) and not name.startswith(".")


def _shown(value) -> str:
    return repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."


__all__ = ["METADATA_FILE", "ExportError", "OnnxClassifier", "output_layer_topk", "sigmoid", "topk"]
