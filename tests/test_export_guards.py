"""The export's lines mutation testing changed unnoticed: the size estimate and the layout it picks near 2 GB, the
export's own check against the PyTorch scores, and the split scorer's head chunk offsets (the tests' head fitted
one chunk)."""

import numpy as np
import pytest
import test_export
import torch
from test_export import K
from torch import nn
from transformers import AutoTokenizer

from haste_hf import HasteForExtremeClassification, onnx_serving
from haste_hf.export import ONNX_FILE_LIMIT_BYTES, _check_against_model, _example_inputs, _graph_bytes, choose_layout
from haste_hf.onnx_serving import output_layer_topk


model_dir, single_export = test_export.model_dir, test_export.single_export  # the fixtures: a saved model, its export


def test_the_graph_size_counts_float_weights_in_4_bytes_and_index_tensors_in_8():
    module = nn.Linear(3, 2)  # 8 floats
    module.register_buffer("positions", torch.zeros(5, dtype=torch.int64))
    module.register_buffer("supports", torch.zeros(2, 3, dtype=torch.int32))  # int64 in the graph
    assert _graph_bytes(module) == 8 * 4 + (5 + 6) * 8


def test_auto_picks_one_file_up_to_the_limit_and_the_split_layout_past_it(caplog):
    assert choose_layout("auto", ONNX_FILE_LIMIT_BYTES, 10) == "single"
    assert choose_layout("auto", ONNX_FILE_LIMIT_BYTES + 1, 10) == "split"
    assert choose_layout("single", ONNX_FILE_LIMIT_BYTES, 10) == "single"
    assert choose_layout("split", 1, 10) == "split"
    with pytest.raises(ValueError, match="use layout='split'"):
        choose_layout("single", ONNX_FILE_LIMIT_BYTES + 1, 10)
    assert 2**31 - (128 << 20) < ONNX_FILE_LIMIT_BYTES < 2**31  # under 2 GB, with room for the graph's own bytes


def test_the_exports_own_check_refuses_scores_that_differ_from_the_models(model_dir, single_export):
    model = HasteForExtremeClassification.from_pretrained(model_dir).eval()
    example = _example_inputs(AutoTokenizer.from_pretrained(model_dir))
    _check_against_model(model, single_export, example, K)  # the model it was exported from: agrees
    with torch.no_grad():
        model.output_layer.head.bias.sub_(1.0)
        model.output_layer.tail.bias.sub_(1.0)
    with pytest.raises(ValueError, match=r"top-5 scores differ from the PyTorch model's by up to"):
        _check_against_model(model, single_export, example, K)


def test_an_export_whose_graph_scores_otherwise_is_refused_and_writes_nothing(model_dir, tmp_path, monkeypatch):
    from haste_hf.export import export_onnx

    top_k = onnx_serving.OnnxClassifier.top_k

    def shifted(self, *args, **kwargs):
        label_ids, scores = top_k(self, *args, **kwargs)
        return label_ids, scores + 1e-3

    monkeypatch.setattr(onnx_serving.OnnxClassifier, "top_k", shifted)
    with pytest.raises(ValueError, match="the exporter mistranslated this encoder"):
        export_onnx(str(model_dir), tmp_path / "out", top_k=K)
    assert not any((tmp_path / "out").iterdir())  # nothing written


def test_the_split_scorer_ranks_a_head_of_several_chunks_as_dense_scores_do():
    generator = np.random.default_rng(0)
    head, groups, group_size, fan_in, width, batch = 11, 5, 4, 3, 6, 3
    labels = head + groups * group_size - 2  # two padding slots in the last group
    output_labels = np.concatenate([generator.permutation(labels), [-1, -1]]).astype(np.int64)
    weights = {
        "head.weight": generator.standard_normal((head, width)).astype(np.float32),
        "head.bias": generator.standard_normal(head).astype(np.float32),
        "tail.weight": generator.standard_normal((groups, group_size, fan_in)).astype(np.float32),
        "tail.supports": np.stack([generator.choice(width, fan_in, replace=False) for _ in range(groups)]),
        "tail.bias": generator.standard_normal(groups * group_size).astype(np.float32),
        "output_labels": output_labels,
    }
    x = generator.standard_normal((batch, width)).astype(np.float32)
    head_logits = x @ weights["head.weight"].T + weights["head.bias"]
    tail_logits = np.einsum("bkf,kgf->bkg", x[:, weights["tail.supports"]], weights["tail.weight"])
    dense = np.concatenate([head_logits, tail_logits.reshape(batch, -1) + weights["tail.bias"]], axis=1)
    dense[:, output_labels < 0] = -np.inf
    expected = np.argsort(-dense, axis=1, kind="stable")[:, :8]
    # 2 rows of 3 examples a chunk: the head is scored in 6 chunks, the tail in 5.
    scores, label_ids = output_layer_topk(weights, x, x, 8, chunk_elements=batch * 2)
    np.testing.assert_array_equal(label_ids, output_labels[expected])
    np.testing.assert_allclose(scores, np.take_along_axis(dense, expected, axis=1), rtol=1e-5)
