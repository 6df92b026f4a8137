"""ONNX export for serving: onnxruntime gives `predict_topk`'s labels from one graph, or from the encoder graph
plus the output layer in safetensors; the command line, the files beside the graph and the refusals."""

import importlib.util
import json
import re
import runpy
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from transformers import AutoTokenizer

import haste_hf.export
from haste_hf import HasteForExtremeClassification
from haste_hf.cli import main
from haste_hf.onnx_serving import OnnxClassifier, output_layer_topk, sigmoid


LABELS = 50
K = 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, encoder_dir):
    """A saved model with a head, a projected tail with biases and a padded last group (45 tail labels in groups
    of 4, 3 padding slots), its output positions shuffled by random label frequencies."""
    torch.manual_seed(0)
    model = HasteForExtremeClassification.from_encoder_pretrained(
        str(encoder_dir),
        label_count=LABELS,
        label_frequencies=torch.randperm(LABELS),
        head_label_count=5,
        group_size=4,
        fan_in=8,
        tail_projection_dim=16,
        tail_bias=True,
        label_names=[f"tag {i}" for i in range(LABELS)],
    )
    with torch.no_grad():
        layer = model.output_layer
        layer.tail.bias.normal_(0, 0.5)
        # Padding slots would outrank every label if a scorer forgot to mask them.
        padding = (layer.output_labels < 0).nonzero().squeeze(1) - model.config.head_label_count
        layer.tail.bias[padding] = 10.0
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(encoder_dir).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def single_export(tmp_path_factory, model_dir):
    output = tmp_path_factory.mktemp("exports") / "single"
    assert main(["export", "--model", str(model_dir), "--format", "onnx", "--output", str(output), "-k", str(K)]) == 0
    return output


def padded_batches(seed=0):
    """Batches of several sizes and lengths, each row padded to its own length (a row of full length included)."""
    generator = torch.Generator().manual_seed(seed)
    for batch_size, length in ((1, 4), (3, 9), (7, 23), (2, 1)):
        input_ids = torch.randint(5, 101, (batch_size, length), generator=generator)
        lengths = torch.randint(1, length + 1, (batch_size,), generator=generator)
        lengths[0] = length
        attention_mask = (torch.arange(length) < lengths[:, None]).long()
        yield input_ids * attention_mask, attention_mask


def expected_top_k(model, input_ids, attention_mask, k):
    top = model.predict_topk(input_ids, attention_mask, k=k)
    return top.label_ids.numpy(), torch.sigmoid(top.scores).numpy()


def test_single_graph_gives_predict_topk_on_onnxruntime(single_export, model_dir):
    files = {path.name for path in single_export.iterdir()}
    assert {
        "model.onnx",
        "label_names.json",
        "tokenizer_config.json",
        "haste_onnx.json",
        "README.md",
        "haste_onnx.py",
    } <= files
    assert not files & {"encoder.onnx", "output_layer.safetensors"}
    graph = onnx.load(single_export / "model.onnx")
    assert {node.domain for node in graph.graph.node} <= {"", "ai.onnx"}  # standard operators only, no custom op
    session = onnxruntime.InferenceSession(single_export / "model.onnx", providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        ("input_ids", ["batch", "sequence"]),
        ("attention_mask", ["batch", "sequence"]),
    ]
    assert [(o.name, o.shape) for o in session.get_outputs()] == [("label_ids", ["batch", K]), ("scores", ["batch", K])]
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    for input_ids, attention_mask in padded_batches():
        label_ids, scores = session.run(
            None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
        )
        expected_ids, expected_scores = expected_top_k(model, input_ids, attention_mask, K)
        np.testing.assert_array_equal(label_ids, expected_ids)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-5, rtol=0)
    metadata = json.loads((single_export / "haste_onnx.json").read_text())
    assert metadata["layout"] == "single" and metadata["top_k"] == K and metadata["label_count"] == LABELS
    assert json.loads((single_export / "label_names.json").read_text())[7] == "tag 7"


def test_onnx_classifier_labels_texts_as_the_pipeline_does(single_export, model_dir):
    from transformers import pipeline

    texts = ["w1 w2 w3", "w40 w7"]
    exported = OnnxClassifier(single_export).predict(texts, k=3)
    served = pipeline("text-classification", model=str(model_dir), top_k=3)(texts)
    assert [[row["label"] for row in text] for text in exported] == [[row["label"] for row in text] for text in served]
    for exported_text, served_text in zip(exported, served):
        np.testing.assert_allclose(
            [row["score"] for row in exported_text], [row["score"] for row in served_text], atol=1e-5
        )
    with pytest.raises(ValueError, match=r"top 5 labels in its graph; `k=6` needs an export"):
        OnnxClassifier(single_export).predict(texts, k=6)


def run_readme_code(folder, monkeypatch) -> dict:
    """Runs every Python block of an export's README in the folder, as a user would; returns its variables."""
    code = "\n".join(re.findall(r"```python\n(.*?)```", (folder / "README.md").read_text(), flags=re.S))
    script = folder / "readme_code.py"
    script.write_text(code)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "haste_onnx", raising=False)
    try:
        return runpy.run_path(str(script))
    finally:
        script.unlink()


def test_single_graph_readme_runs_as_written(single_export, monkeypatch):
    variables = run_readme_code(single_export, monkeypatch)
    assert variables["label_ids"].shape == variables["scores"].shape == (1, K)


def test_an_output_layer_past_the_onnx_file_limit_goes_to_safetensors(
    single_export, model_dir, tmp_path, monkeypatch, caplog
):
    # A previous single-graph export, replaced: its model.onnx must not stay beside the new layout.
    output = tmp_path / "split"
    shutil.copytree(single_export, output)
    monkeypatch.setattr(haste_hf.export, "ONNX_FILE_LIMIT_BYTES", 10_000)  # the tiny model's weights pass it
    with caplog.at_level("WARNING"):
        assert haste_hf.export.export_onnx(str(model_dir), output, top_k=K, overwrite=True) == "split"
    assert "pass ONNX's 2 GB limit on one file: exporting the encoder alone" in caplog.text
    files = {path.name for path in output.iterdir()}
    assert {
        "encoder.onnx",
        "output_layer.safetensors",
        "label_names.json",
        "haste_onnx.py",
    } <= files and "model.onnx" not in files
    assert "encoder.onnx.data" in files  # the encoder passes the lowered limit too: its weights lie beside its graph
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    classifier = OnnxClassifier(output)
    for input_ids, attention_mask in padded_batches(seed=1):
        # Any k: the output layer is scored in numpy, in chunks of a few labels here, merged across chunks.
        features = dict(
            zip(
                ["head_features", "tail_features"],
                classifier.session.run(
                    None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
                ),
            )
        )
        logits, label_ids = output_layer_topk(
            classifier.output_layer, features["head_features"], features["tail_features"], 12, chunk_elements=40
        )
        expected_ids, expected_scores = expected_top_k(model, input_ids, attention_mask, 12)
        np.testing.assert_array_equal(label_ids, expected_ids)
        np.testing.assert_allclose(sigmoid(logits), expected_scores, atol=1e-5, rtol=0)
        label_ids, scores = classifier.top_k(input_ids.numpy(), attention_mask.numpy(), k=LABELS)
        expected_ids, expected_scores = expected_top_k(model, input_ids, attention_mask, LABELS)
        np.testing.assert_array_equal(label_ids, expected_ids)  # every label once: padding slots never rank
    variables = run_readme_code(output, monkeypatch)
    assert variables["label_ids"].shape == (1, K) and variables["scores"].max() <= 1
    monkeypatch.setattr(haste_hf.export, "ONNX_FILE_LIMIT_BYTES", 10_000)
    with pytest.raises(ValueError, match="use layout='split'"):
        haste_hf.export.export_onnx(str(model_dir), tmp_path / "refused", layout="single")


def test_int8_encoder_keeps_the_output_layer_in_float(model_dir, tmp_path, capsys):
    output = tmp_path / "int8"
    assert (
        main(["export", "--model", str(model_dir), "--output", str(output), "--quantize", "--split-output-layer"]) == 0
    )
    assert "split layout" in capsys.readouterr().out
    graph = onnx.load(output / "encoder.onnx")
    assert any(node.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for node in graph.graph.node)
    assert json.loads((output / "haste_onnx.json").read_text())["quantization"].startswith("dynamic int8")
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    input_ids, attention_mask = next(padded_batches(seed=2))
    _, scores = OnnxClassifier(output).top_k(input_ids.numpy(), attention_mask.numpy(), k=K)
    _, expected_scores = expected_top_k(model, input_ids, attention_mask, K)
    assert np.abs(scores - expected_scores).max() < 0.05


def test_export_refusals(model_dir, single_export, tmp_path, capsys, monkeypatch):
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    assert main(["export", "--model", str(model_dir), "--output", str(occupied)]) == 2
    assert "holds other files (notes.txt): export into a new or empty folder" in capsys.readouterr().err
    assert main(["export", "--model", str(model_dir), "--output", str(single_export)]) == 2
    assert "holds an export already: pass --overwrite" in capsys.readouterr().err
    assert main(["export", "--model", str(model_dir), "--output", str(tmp_path / "new"), "-k", str(LABELS + 1)]) == 1
    assert f"`top_k` must be an integer in [1, label_count={LABELS}], got {LABELS + 1}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--model", str(model_dir), "--format", "tflite"])
    assert exit_info.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "onnxscript" else real_find_spec(name)
    )
    assert main(["export", "--model", str(model_dir), "--output", str(tmp_path / "new")]) == 1
    assert "needs onnxscript, which is not installed: pip install 'haste_hf[export]'" in capsys.readouterr().err
    with pytest.raises(ImportError, match=r"pip install 'haste_hf\[export\]'"):
        haste_hf.export_onnx(str(model_dir), tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_a_bf16_output_layer_exports_in_float32_and_the_model_keeps_its_dtype(model_dir, tmp_path):
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    layer = model.output_layer
    layer.head.to(torch.bfloat16), layer.tail.to(torch.bfloat16)  # as `--bf16` training leaves the output layer
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert haste_hf.export_onnx(model, tmp_path / "bf16", top_k=K, tokenizer=tokenizer, layout="split") == "split"
    assert layer.tail.weight.dtype == torch.bfloat16
    reference = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    twin = reference.output_layer
    twin.head.weight.data, twin.tail.weight.data = layer.head.weight.float(), layer.tail.weight.float()
    twin.head.bias.data, twin.tail.bias.data = layer.head.bias.float(), layer.tail.bias.float()
    classifier = OnnxClassifier(tmp_path / "bf16")
    for input_ids, attention_mask in padded_batches(seed=3):
        label_ids, scores = classifier.top_k(input_ids.numpy(), attention_mask.numpy())
        expected_ids, expected_scores = expected_top_k(reference, input_ids, attention_mask, K)
        np.testing.assert_array_equal(label_ids, expected_ids)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="Give the `tokenizer` of the model"):
        haste_hf.export_onnx(model, tmp_path / "no-tokenizer")


def test_serving_needs_what_the_readme_says(single_export, tmp_path):
    """`top_k` of token ids runs with numpy and onnxruntime alone (torch, transformers and haste_hf hidden); `predict`
    needs transformers for the tokenizer, and says so in one line without it."""
    script = f"""
import sys
for name in ("torch", "transformers", "haste_hf"):
    sys.modules[name] = None
sys.path.insert(0, {str(single_export)!r})
import numpy as np
from haste_onnx import OnnxClassifier

classifier = OnnxClassifier({str(single_export)!r})
label_ids, scores = classifier.top_k(np.array([[2, 9, 10, 3]]), np.ones((1, 4), dtype=np.int64))
assert label_ids.shape == (1, {K}), label_ids.shape
try:
    classifier.predict(["a text"])
except ImportError as error:
    print(error)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "`predict` tokenizes texts with the export's tokenizer through transformers (torch not needed): pip install "
        "transformers, or tokenize the texts yourself and call `top_k(input_ids, attention_mask)`."
    ]
    assert "`predict` of texts also\n  transformers" in (single_export / "README.md").read_text()


@pytest.mark.parametrize("parts", ["head", "tail", "both"])
@pytest.mark.parametrize("biases", [False, True])
def test_the_output_layers_numpy_top_k_is_the_top_k_of_every_labels_logit_whatever_the_chunks(parts, biases):
    """`output_layer_topk` (the serving's top-k without `[B, L]` logits) against every label's logit computed one at
    a time: a head, a tail (its last 2 slots padding, which never win), or both, with or without biases, in chunks
    of one row or group, a few, or all at once; k of a few labels and of all of them."""
    rng = np.random.default_rng(0)
    head_rows, groups, group_size, fan_in, width, batch = 5, 4, 3, 4, 8, 3
    has_head, has_tail = parts != "tail", parts != "head"
    positions = head_rows * has_head + groups * group_size * has_tail
    padding = 2 if has_tail else 0
    label_count = positions - padding
    output_labels = np.concatenate([rng.permutation(label_count), -np.ones(padding, np.int64)]).astype(np.int64)
    weights = {"output_labels": output_labels}
    head_x = rng.standard_normal((batch, width)).astype(np.float32) if has_head else None
    tail_x = rng.standard_normal((batch, width)).astype(np.float32) if has_tail else None
    if has_head:
        weights["head.weight"] = rng.standard_normal((head_rows, width)).astype(np.float32)
        if biases:
            weights["head.bias"] = rng.standard_normal(head_rows).astype(np.float32)
    if has_tail:
        weights["tail.weight"] = rng.standard_normal((groups, group_size, fan_in)).astype(np.float32)
        weights["tail.supports"] = np.stack([rng.permutation(width)[:fan_in] for _ in range(groups)]).astype(np.int64)
        if biases:
            weights["tail.bias"] = rng.standard_normal(groups * group_size).astype(np.float32)
    logits = np.full((batch, label_count), np.nan, np.float64)
    for position, label in enumerate(output_labels):
        if label < 0:
            continue
        if has_head and position < head_rows:
            value = head_x.astype(np.float64) @ weights["head.weight"][position]
            value += weights["head.bias"][position] if biases else 0.0
        else:
            slot = position - head_rows * has_head
            group, member = divmod(slot, group_size)
            gathered = tail_x[:, weights["tail.supports"][group]].astype(np.float64)
            value = gathered @ weights["tail.weight"][group, member]
            value += weights["tail.bias"][slot] if biases else 0.0
        logits[:, label] = value
    assert not np.isnan(logits).any()
    for k in (4, label_count):
        expected_ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        expected_scores = np.take_along_axis(logits, expected_ids, axis=1)
        for chunk_elements in (1, 7, 10**6):
            scores, ids = output_layer_topk(weights, head_x, tail_x, k, chunk_elements)
            assert ids.shape == (batch, k) and scores.dtype == np.float32, (k, chunk_elements)
            np.testing.assert_array_equal(ids, expected_ids)
            np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
