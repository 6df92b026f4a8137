# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Serving a HASTE model exported by `haste_hf.export.export_onnx` with onnxruntime, without torch.

An export folder holds one of two layouts (`haste_onnx.json` says which):

- ``single``: `model.onnx` maps `input_ids`, `attention_mask` `[batch, sequence]` to the top-k `label_ids` and
  their `scores` (sigmoid probabilities) `[batch, k]`: encoder, pooling, head, tail and top-k in one graph.
- ``split`` (an output layer too large for one ONNX file): `encoder.onnx` maps the same inputs to the inputs of
  the output layer (`head_features`, `tail_features`), and `output_layer.safetensors` holds the output layer,
  scored here in numpy a chunk of labels at a time, so memory stays `O(batch * (k + chunk))`.

`OnnxClassifier` serves both. This file is flat and imports only numpy, onnxruntime and safetensors (and the
tokenizer's library for `predict`): the export copies it beside the model as `haste_onnx.py`.
"""

import json
import os

import numpy as np


METADATA_FILE = "haste_onnx.json"
LABEL_NAMES_FILE = "label_names.json"
# Logits scored at once by the split layout's top-k (`[batch, chunk]` fp32 block).
TOPK_CHUNK_ELEMENTS = 1 << 24


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


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return (0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32)  # exp-free: no overflow warnings at +-inf


class OnnxClassifier:
    """The top-k labels of texts from an exported HASTE model, on onnxruntime.

        classifier = OnnxClassifier("exported")
        label_ids, scores = classifier.top_k(input_ids, attention_mask)   # int64 arrays [batch, sequence]
        classifier.predict(["a text", "another"])   # [[{"label": ..., "score": ...}, ...], ...]

    Scores are sigmoid probabilities. `providers` and `session_options` go to `onnxruntime.InferenceSession`.
    """

    def __init__(self, folder, providers=("CPUExecutionProvider",), session_options=None):
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(
                "Serving an ONNX export needs onnxruntime: pip install onnxruntime (or 'haste_hf[export]')"
            ) from None

        self.folder = os.fspath(folder)
        with open(os.path.join(self.folder, METADATA_FILE), encoding="utf-8") as f:
            self.metadata = json.load(f)
        self.layout = self.metadata["layout"]
        self.top_k_default = self.metadata["top_k"]
        graph = os.path.join(self.folder, self.metadata["model_file"])
        self.session = onnxruntime.InferenceSession(graph, sess_options=session_options, providers=list(providers))
        self.output_layer = None
        if self.layout == "split":
            from safetensors.numpy import load_file

            self.output_layer = load_file(os.path.join(self.folder, self.metadata["output_layer_file"]))
        names_file = os.path.join(self.folder, LABEL_NAMES_FILE)
        self.label_names = None
        if os.path.isfile(names_file):
            with open(names_file, encoding="utf-8") as f:
                self.label_names = json.load(f)
        self._tokenizer = None

    def top_k(self, input_ids, attention_mask, k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """`(label_ids, scores)`, each `[batch, k]`, best first. `k` defaults to the export's; a single-graph export
        computes that many, so a smaller `k` is a slice of them and a larger one is refused."""
        k = self.top_k_default if k is None else k
        label_count = self.metadata["label_count"]
        if not 1 <= k <= label_count:
            raise ValueError(f"`k` must lie in [1, label_count={label_count}], got {k}.")
        inputs = {
            "input_ids": np.asarray(input_ids, dtype=np.int64),
            "attention_mask": np.asarray(attention_mask, dtype=np.int64),
        }
        outputs = dict(zip([output.name for output in self.session.get_outputs()], self.session.run(None, inputs)))
        if self.layout == "single":
            if k > self.top_k_default:
                raise ValueError(
                    f"This export computes the top {self.top_k_default} labels in its graph; `k={k}` needs an export "
                    f"with a larger top-k (`haste-hf export -k {k}`)."
                )
            return outputs["label_ids"][:, :k], outputs["scores"][:, :k]
        logits, label_ids = output_layer_topk(
            self.output_layer, outputs.get("head_features"), outputs.get("tail_features"), k
        )
        return label_ids, sigmoid(logits)

    def predict(self, texts: list[str], k: int | None = None) -> list[list[dict]]:
        """The `k` best `{"label", "score"}` of each text, tokenized by the exported tokenizer (cut at its
        `model_max_length`, the length the model was trained on)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.folder)
        batch = self._tokenizer(list(texts), truncation=True, padding=True, return_tensors="np")
        label_ids, scores = self.top_k(batch["input_ids"], batch["attention_mask"], k)
        names = self.label_names
        return [
            [
                {"label": names[i] if names is not None else f"LABEL_{i}", "score": float(s)}
                for i, s in zip(row_ids, row_scores)
            ]
            for row_ids, row_scores in zip(label_ids.tolist(), scores)
        ]


__all__ = ["METADATA_FILE", "OnnxClassifier", "output_layer_topk", "sigmoid", "topk"]
