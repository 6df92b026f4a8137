# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Exporting a trained HASTE model for serving: ONNX graphs that onnxruntime runs without torch.

`export_onnx` writes a folder (`haste_onnx.json` describes it) in one of two layouts:

- ``single``: `model.onnx`, one graph of encoder + pooling + projections + head + tail + top-k, inputs
  `input_ids` / `attention_mask` `[batch, sequence]` (both axes dynamic), outputs the top-k `label_ids` (int64)
  and their `scores` (sigmoid probabilities) `[batch, k]`. The tail runs as the PyTorch path of
  `group_sparse_linear` does (a gather of each group's support, then a batched matmul): standard ONNX ops only.
- ``split``: `encoder.onnx` (encoder + pooling + projections, outputs `head_features` / `tail_features`) and
  `output_layer.safetensors` (head, tail, supports, `output_labels`), scored by `onnx_serving.output_layer_topk`.
  Chosen when the single graph would pass ONNX's 2 GB limit on one file (a protobuf message), i.e. at millions
  of labels, where it would also hold `[batch, L]` logits; the split scorer works a chunk of labels at a time.

Beside the graph: the tokenizer (its `model_max_length` is the training length), `label_names.json`, a README,
and `haste_onnx.py` (a copy of `onnx_serving.py`, which serves both layouts with numpy and onnxruntime).
"""

import contextlib
import copy
import hashlib
import json
import logging as std_logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from . import onnx_serving
from .import_utils import EXPORT_PACKAGES, missing_packages
from .modeling.logging_utils import get_logger
from .modeling.modeling_haste import HasteForExtremeClassification
from .modeling.saving import read_one_save, save_folder_atomically
from .training.sharded_output_layer import ShardedOutputLayer


logger = get_logger(__name__)

EXPORT_FORMATS = ("onnx",)
LAYOUTS = ("auto", "single", "split")
# One ONNX file is one protobuf message, which cannot exceed 2 GiB; the margin leaves room for the graph itself.
ONNX_FILE_LIMIT_BYTES = 2**31 - (64 << 20)
MIN_TORCH_VERSION = (2, 9)  # the torch.export-based ONNX exporter, default since 2.9
SINGLE_GRAPH_FILE, ENCODER_GRAPH_FILE, OUTPUT_LAYER_FILE = "model.onnx", "encoder.onnx", "output_layer.safetensors"
SERVING_CODE_FILE = "haste_onnx.py"
FEATURE_NAMES = ("head_features", "tail_features")
INPUT_NAMES, OUTPUT_NAMES = ("input_ids", "attention_mask"), ("label_ids", "scores")


def check_export_dependencies():
    """Raises an `ImportError` naming the install command when a package the export needs is missing."""
    missing = missing_packages(EXPORT_PACKAGES)
    if missing:
        raise ImportError(
            f"Exporting to ONNX needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            "pip install 'haste_hf[export]'"
        )
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < MIN_TORCH_VERSION:
        raise ImportError(
            f"Exporting to ONNX needs torch>={'.'.join(map(str, MIN_TORCH_VERSION))} (its torch.export-based exporter), "
            f"found {torch.__version__}: pip install -U torch"
        )


def check_export_dir(output_dir, overwrite: bool = False) -> None:
    """Raises a `ValueError` unless `output_dir` is new, empty, or (with `overwrite`) a previous export: an export
    never mixes its files with a model folder or anything else."""
    folder = Path(output_dir)
    if folder.is_file():
        raise ValueError(f"`output_dir` ({folder}) is a file: give a folder path.")
    held = sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) if folder.is_dir() else []
    if not held:
        return
    if not (folder / onnx_serving.METADATA_FILE).is_file():
        raise ValueError(
            f"`output_dir` ({folder}) holds other files ({', '.join(held[:4])}{', ...' if len(held) > 4 else ''}): "
            "export into a new or empty folder."
        )
    if not overwrite:
        raise ValueError(
            f"`output_dir` ({folder}) holds an export already: pass --overwrite (`overwrite=True`) to replace it."
        )


class EncoderGraph(nn.Module):
    """`input_ids`, `attention_mask` -> the inputs of the head and of the tail (pooled, normalised, projected)."""

    def __init__(self, model: HasteForExtremeClassification):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        pooled, _ = self.model.encode(input_ids, attention_mask)
        return tuple(x for x in self.model.output_layer.branch_inputs(pooled) if x is not None)


class OutputLayerGraph(nn.Module):
    """Branch inputs -> the `k` best label ids and their sigmoid scores, from all `[B, positions]` logits.

    The tail is `sparse_ops.group_sparse_linear`'s PyTorch path without its chunking (whose chunk count depends on
    the batch size, which is dynamic here): gather each group's support `[B, K, F]`, one batched matmul with the
    weights `[K, F, G]`. Padding slots are masked before the top-k, as `predict_topk` does."""

    def __init__(self, model: HasteForExtremeClassification, k: int):
        super().__init__()
        self.k = k
        layer = model.output_layer
        self.head = layer.head
        self.tail = layer.tail
        self.register_buffer("output_labels", layer.output_labels.clone())
        self.register_buffer("padding", layer.output_labels < 0)
        if layer.tail is not None:
            # int64: the index type of ONNX Gather every runtime takes.
            self.register_buffer("flat_supports", layer.tail.supports.reshape(-1).long())

    def forward(self, *features):
        """`features`: the head's input `[B, d_h]` and / or the tail's `[B, d_t]`, for the branches the model has."""
        head_x = features[0] if self.head is not None else None
        tail_x = features[-1] if self.tail is not None else None
        logits = []
        if self.head is not None:
            logits.append(self.head(head_x))
        if self.tail is not None:
            group_count, group_size, fan_in = self.tail.weight.shape
            batch_size = tail_x.shape[0]
            gathered = tail_x.index_select(1, self.flat_supports).view(batch_size, group_count, fan_in)
            tail = torch.matmul(gathered.transpose(0, 1), self.tail.weight.transpose(1, 2))  # [K, B, G]
            tail = tail.transpose(0, 1).reshape(batch_size, group_count * group_size)
            logits.append(tail if self.tail.bias is None else tail + self.tail.bias)
        logits = torch.cat(logits, dim=1) if len(logits) > 1 else logits[0]
        scores, positions = logits.masked_fill(self.padding, float("-inf")).topk(self.k, dim=1)
        return self.output_labels[positions], torch.sigmoid(scores)


def _graph_bytes(module: nn.Module) -> int:
    """Bytes of the module's constants in a graph: fp32 weights, int64 index tensors (supports, label map)."""
    return sum(t.numel() * (8 if not t.is_floating_point() else 4) for t in (*module.parameters(), *module.buffers()))


def choose_layout(layout: str, graph_bytes: int, label_count: int) -> str:
    """`layout`, or for `"auto"` the single graph unless weights of `graph_bytes` pass ONNX's limit on one file;
    refuses a single graph past that limit."""
    if layout == "auto":
        layout = "single" if graph_bytes <= ONNX_FILE_LIMIT_BYTES else "split"
        if layout == "split":
            logger.warning(
                f"The model's weights ({graph_bytes / 2**30:.1f} GiB with its {label_count:,} labels) pass ONNX's 2 GB limit "
                f"on one file: exporting the encoder alone ({ENCODER_GRAPH_FILE}) and the output layer in safetensors "
                f"({OUTPUT_LAYER_FILE}), scored by {SERVING_CODE_FILE}."
            )
    elif layout == "single" and graph_bytes > ONNX_FILE_LIMIT_BYTES:
        raise ValueError(
            f"The model's weights ({graph_bytes / 2**30:.1f} GiB) pass ONNX's 2 GB limit on one file: use layout='split' "
            "(the encoder in ONNX, the output layer in safetensors)."
        )
    return layout


def _load(model, tokenizer):
    """The model in float32 (onnxruntime's CPU kernels are fp32) and its tokenizer."""
    from transformers import AutoTokenizer

    if isinstance(model, (str, os.PathLike)):
        source = os.fspath(model)
        # The tokenizer of the same save as the weights (`read_one_save`).
        return read_one_save(
            source,
            lambda: (
                HasteForExtremeClassification.from_pretrained(source, dtype=torch.float32),
                tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(source),
                source,
            ),
        )
    if not isinstance(model, HasteForExtremeClassification):
        raise ValueError(
            f"`model` must be a HasteForExtremeClassification or the folder / Hub id of one, got {type(model).__name__}."
        )
    if tokenizer is None:
        raise ValueError("Give the `tokenizer` of the model: it is exported beside the graph, which takes token ids.")
    if isinstance(model.output_layer, ShardedOutputLayer):
        raise ValueError("This model holds one rank's share of the output layer: save it and export the saved folder.")
    if any(t.is_floating_point() and t.dtype != torch.float32 for t in (*model.parameters(), *model.buffers())):
        label_names = model.label_names
        model = copy.deepcopy(model).float()  # the caller's model keeps its dtype
        model.label_names = label_names
    return model, tokenizer, getattr(model, "name_or_path", None) or None


def _example_inputs(tokenizer):
    """A padded batch of two texts of different lengths: what the exporter traces (padding included, so no
    shortcut for an all-ones mask is traced into the graph)."""
    batch = tokenizer(["short text", "a somewhat longer text to pad the other one"], padding=True, return_tensors="pt")
    if bool(batch["attention_mask"].all()):
        raise ValueError(
            "The tokenizer does not pad a batch (no pad token?): set `tokenizer.pad_token` before exporting."
        )
    return batch["input_ids"], batch["attention_mask"]


@contextlib.contextmanager
def _quiet_exporter():
    """Hides the exporter's progress lines and its warnings about its own internals (not about the model)."""
    # The root logger too: onnxruntime's quantization logs through it.
    loggers = [std_logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")] + [
        std_logging.getLogger()
    ]
    levels = [item.level for item in loggers]
    for item in loggers:
        item.setLevel(std_logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"torch\.onnx.*|copyreg|onnxscript.*")
            yield
    finally:
        for item, level in zip(loggers, levels):
            item.setLevel(level)


def _export_graph(module, args, input_names, output_names, dynamic_shapes):
    with torch.no_grad(), _quiet_exporter():
        program = torch.onnx.export(
            module.eval(),
            args,
            dynamo=True,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
    return program


def _encoder_graph(model, example):
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    axes = {0: batch, 1: sequence}
    layer = model.output_layer
    features = [name for name, branch in zip(FEATURE_NAMES, (layer.head, layer.tail)) if branch is not None]
    program = _export_graph(
        EncoderGraph(model), example, INPUT_NAMES, features, {"input_ids": axes, "attention_mask": axes}
    )
    return program, features


def _single_graph(model, encoder_proto, features, example, k: int):
    """The encoder graph composed with the output layer's graph into one."""
    import onnx

    with torch.no_grad():
        branch_inputs = EncoderGraph(model)(*example)
    batch = torch.export.Dim("batch")
    head = _export_graph(
        OutputLayerGraph(model, k),
        branch_inputs,
        features,
        OUTPUT_NAMES,
        {"features": tuple({0: batch} for _ in features)},
    ).model_proto
    # Internal names of the two exports may collide; the features keep theirs, which connect the graphs.
    head = onnx.compose.add_prefix(head, "output_layer/", rename_inputs=False, rename_outputs=False)
    return onnx.compose.merge_models(encoder_proto, head, io_map=[(name, name) for name in features])


def quantize_encoder_int8(encoder_proto):
    """The encoder graph (its projections included) with its MatMul weights in int8 and their inputs quantized on the
    fly (`onnxruntime.quantization.quantize_dynamic`): smaller, and faster on CPU; scores move by about 1e-3-1e-2,
    which `benchmarks/serving.py` measures in P@k."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as folder, _quiet_exporter():
        source, target = os.path.join(folder, "encoder.onnx"), os.path.join(folder, "encoder.int8.onnx")
        onnx.save(encoder_proto, source)
        quantize_dynamic(source, target, op_types_to_quantize=["MatMul"], weight_type=QuantType.QInt8)
        return onnx.load(target)


def export_onnx(
    model,
    output_dir,
    top_k: int = 5,
    *,
    tokenizer=None,
    layout: str = "auto",
    quantize: bool = False,
    overwrite: bool = False,
) -> str:
    """Exports a HASTE model to ONNX for serving with onnxruntime (see the module docstring for the files).

    Args:
        model: a `HasteForExtremeClassification`, or the folder / Hub id of a saved one.
        output_dir: the export folder: new, empty, or a previous export with `overwrite=True`.
        top_k: labels per text the single graph returns (the split layout scores any k).
        tokenizer: the model's tokenizer (read from `model` when that is a folder or Hub id).
        layout: `"single"` (one graph), `"split"` (encoder graph + output layer in safetensors) or `"auto"`: single
            unless its weights pass ONNX's 2 GB limit on one file.
        quantize: quantize the encoder graph's matmuls to int8 (dynamic quantization); the output layer stays fp32.
        overwrite: replace a previous export in `output_dir`.

    Returns the layout written. The export is checked before it is written: onnxruntime must give the PyTorch model's
    top-k scores on a padded batch (within 1e-4; skipped for `quantize`, which changes scores by design).
    """
    check_export_dependencies()
    if layout not in LAYOUTS:
        raise ValueError(f"`layout` must be one of {LAYOUTS}, got {layout!r}.")
    check_export_dir(output_dir, overwrite)
    model, tokenizer, source = _load(model, tokenizer)
    label_count = model.config.label_count
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= label_count:
        raise ValueError(f"`top_k` must be an integer in [1, label_count={label_count}], got {top_k!r}.")
    layout = choose_layout(layout, _graph_bytes(model), label_count)
    model.eval()
    example = _example_inputs(tokenizer)
    encoder, features = _encoder_graph(model, example)
    encoder_proto = None if layout == "split" and not quantize else encoder.model_proto
    if quantize:
        encoder_proto = quantize_encoder_int8(encoder_proto)
    graph = _single_graph(model, encoder_proto, features, example, top_k) if layout == "single" else encoder_proto

    def write(staging):
        import onnx

        if graph is not None:
            onnx.save(graph, os.path.join(staging, SINGLE_GRAPH_FILE if layout == "single" else ENCODER_GRAPH_FILE))
        else:  # an encoder of more than 2 GB keeps its weights in a file beside the graph
            encoder.save(
                os.path.join(staging, ENCODER_GRAPH_FILE),
                external_data=_graph_bytes(model.encoder) > ONNX_FILE_LIMIT_BYTES,
            )
        if layout == "split":
            _save_output_layer(model, os.path.join(staging, OUTPUT_LAYER_FILE))
        tokenizer.save_pretrained(staging)
        if model.label_names is not None:
            with open(os.path.join(staging, onnx_serving.LABEL_NAMES_FILE), "w", encoding="utf-8") as f:
                json.dump(list(model.label_names), f, ensure_ascii=False)  # a compact table too
        # Every file serving reads, with its size and digest: the export is checked as one unit when it loads.
        files = describe_files(staging, set(os.listdir(staging)) - set(onnx_serving.UNLISTED_FILES))
        metadata = _metadata(model, tokenizer, layout, top_k, quantize, features, source, files)
        with open(os.path.join(staging, onnx_serving.METADATA_FILE), "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2)
        Path(staging, "README.md").write_text(_readme(metadata), encoding="utf-8")
        shutil.copyfile(onnx_serving.__file__, os.path.join(staging, SERVING_CODE_FILE))
        if not quantize:
            _check_against_model(model, staging, example, top_k)
        written.update(os.listdir(staging))

    previous, written = _previous_export_files(output_dir), set()
    save_folder_atomically(os.fspath(output_dir), write)
    for name in previous - written:  # a previous export of the other layout
        os.remove(os.path.join(output_dir, name))
    return layout


def describe_files(folder, names) -> dict:
    """`{name: {"bytes": size, "sha256": hex digest}}` of files `names` of `folder`: what an export's metadata
    records of its files, and what `onnx_serving` checks them against."""
    described = {}
    for name in sorted(names):
        digest = hashlib.sha256()
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
        described[name] = {"bytes": os.path.getsize(os.path.join(folder, name)), "sha256": digest.hexdigest()}
    return described


def _save_output_layer(model, path):
    from safetensors.torch import save_file

    tensors = {}
    for name, tensor in model.output_layer.state_dict().items():
        if name == "output_labels" or name.startswith(("head.", "tail.")):
            tensors[name] = tensor
    save_file({name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}, path)


def _check_against_model(model, folder, example, k: int):
    """Raises a `ValueError` unless onnxruntime scores `example` as the PyTorch model does."""
    input_ids, attention_mask = example
    exported = onnx_serving.OnnxClassifier(folder)
    _, scores = exported.top_k(input_ids.numpy(), attention_mask.numpy(), k)
    expected = torch.sigmoid(model.predict_topk(input_ids, attention_mask, k=k).scores).numpy()
    difference = float(abs(scores - expected).max())
    if not difference <= 1e-4:
        raise ValueError(
            f"The exported graph's top-{k} scores differ from the PyTorch model's by up to {difference:.2e} on a test "
            "batch: the exporter mistranslated this encoder. Please report it with the encoder's name."
        )


def _previous_export_files(output_dir) -> set[str]:
    """The graph and weight files of the export `output_dir` holds, which a new export of another layout drops."""
    folder = Path(output_dir)
    if not (folder / onnx_serving.METADATA_FILE).is_file():
        return set()
    graph_files = (SINGLE_GRAPH_FILE, ENCODER_GRAPH_FILE, OUTPUT_LAYER_FILE)
    return {path.name for path in folder.iterdir() if path.name.startswith(graph_files)}


def _metadata(model, tokenizer, layout, top_k, quantize, features, source, files) -> dict:
    from . import __version__
    from .recipe import encoder_token_limit

    config = model.config
    metadata = {
        "format": "haste_hf onnx export",
        "layout": layout,
        "model_file": SINGLE_GRAPH_FILE if layout == "single" else ENCODER_GRAPH_FILE,
        "inputs": list(INPUT_NAMES),
        "outputs": list(OUTPUT_NAMES) if layout == "single" else features,
        "top_k": top_k,
        "scores": "sigmoid probabilities",
        "label_count": config.label_count,
        "head_label_count": config.head_label_count,
        "tail_label_count": config.tail_label_count,
        "group_size": config.group_size,
        "fan_in": config.fan_in,
        "pooling": config.pooling,
        "normalize": config.normalize,
        "max_length": tokenizer.model_max_length,
        "max_positions": encoder_token_limit(model.encoder),
        "quantization": "dynamic int8 (encoder matmuls)" if quantize else None,
        "source": source,
        "haste_hf": __version__,
        "torch": torch.__version__,
    }
    if layout == "split":
        metadata["output_layer_file"] = OUTPUT_LAYER_FILE
    metadata["files"] = files
    return metadata


def _readme(metadata: dict) -> str:
    """The export folder's README: what the files are and how to score texts with them."""
    k, label_count = metadata["top_k"], metadata["label_count"]
    quantized = (
        f"\nThe encoder's matmuls are quantized to int8 ({metadata['quantization']}).\n"
        if metadata["quantization"]
        else ""
    )
    if metadata["layout"] == "single":
        files = (
            f"- `{SINGLE_GRAPH_FILE}`: encoder, pooling, output layer and top-k in one graph. Inputs `input_ids`, "
            "`attention_mask` (int64 `[batch, sequence]`, any batch size and length up to the encoder's positions); "
            f"outputs `label_ids` (int64) and `scores` (float32 sigmoid probabilities), `[batch, {k}]`, best first."
        )
        usage = f"""```python
import onnxruntime
from transformers import AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(".")
session = onnxruntime.InferenceSession("{SINGLE_GRAPH_FILE}", providers=["CPUExecutionProvider"])
batch = tokenizer(["a text to label"], truncation=True, padding=True, return_tensors="np")
label_ids, scores = session.run(None, {{"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}})
```"""
    else:
        files = (
            f"- `{ENCODER_GRAPH_FILE}`: encoder, pooling and projections. Inputs `input_ids`, `attention_mask` (int64 "
            f"`[batch, sequence]`); outputs {', '.join(f'`{name}`' for name in metadata['outputs'])} (float32 `[batch, d]`), "
            f"the inputs of the output layer.\n- `{OUTPUT_LAYER_FILE}`: the output layer of {label_count:,} labels, too "
            "large for one ONNX file (2 GB limit): `head.weight [H, d_h]` (+ `head.bias`), `tail.weight [K, G, F]`, "
            "`tail.supports [K, F]` (the features each group of G labels reads), `output_labels` (the label id of each "
            f"output position, -1 for padding). `{SERVING_CODE_FILE}` scores it a chunk of labels at a time: tail logit "
            "`k * G + g` is `tail.weight[k, g] . tail_features[supports[k]]`, positions are the head's H then the tail's."
        )
        usage = f"""```python
import onnxruntime
from safetensors.numpy import load_file
from transformers import AutoTokenizer

from haste_onnx import output_layer_topk, sigmoid

tokenizer = AutoTokenizer.from_pretrained(".")
session = onnxruntime.InferenceSession("{ENCODER_GRAPH_FILE}", providers=["CPUExecutionProvider"])
output_layer = load_file("{OUTPUT_LAYER_FILE}")
batch = tokenizer(["a text to label"], truncation=True, padding=True, return_tensors="np")
outputs = session.run(None, {{"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}})
features = dict(zip([output.name for output in session.get_outputs()], outputs))
logits, label_ids = output_layer_topk(output_layer, features.get("head_features"), features.get("tail_features"), k={k})
scores = sigmoid(logits)
```"""
    return f"""# HASTE model exported to ONNX ({metadata["layout"]} layout)

Extreme multi-label classifier of {label_count:,} labels exported by haste_hf {metadata["haste_hf"]} from
`{metadata["source"]}`. Serve it with onnxruntime; torch is not needed.
{quantized}
{files}
- `label_names.json`: the name of each label id (when the model has names).
- the tokenizer files: texts are truncated at its `model_max_length` ({metadata["max_length"]}), the length the model was trained on.
- `{onnx_serving.METADATA_FILE}`: this description, with the size and sha256 digest of every file serving reads, read by
  `{SERVING_CODE_FILE}`, which refuses a folder whose files differ from them.
- `{SERVING_CODE_FILE}`: `OnnxClassifier`, the top-k labels and names of texts for this folder: `top_k` of token ids
  needs numpy and onnxruntime{" and safetensors" if metadata["layout"] == "split" else ""}; `predict` of texts also
  transformers, for the tokenizer (torch is not needed).

Scores are sigmoid probabilities: each label is scored independently, so they do not sum to 1.

{usage}

With the code beside the graph:

```python
from haste_onnx import OnnxClassifier

print(OnnxClassifier(".").predict(["a text to label"]))   # [[{{"label": ..., "score": ...}}, ...]]
```
"""


__all__ = ["EncoderGraph", "OutputLayerGraph", "check_export_dependencies", "export_onnx", "quantize_encoder_int8"]
