"""Lines that mutation testing changed without a test noticing, each guarded here by a test that fails when the
line is broken: the seeded validation hold-out `group` and `train --layout-file` share, the ONNX size estimate
and the layout it picks near 2 GB, the export's own check against the PyTorch scores, the split scorer's head
chunk offsets, the run lock when a restarted job has its old pid back or another process holds the OS lock of a
file naming no live owner, bf16 momentum on float32 weights, the label-name limit of config.json at exactly
10,000 labels, propensity presets written with separators, and `filter_top_k` with a -1 before a real id."""

import json
import os
import socket

import numpy as np
import pytest
import test_export
import torch
from test_export import K
from tiny_encoders import tiny_encoder_config
from torch import nn
from transformers import AutoTokenizer
from transformers.testing_utils import CaptureLogger

from haste_hf import HasteConfig, HasteForExtremeClassification, onnx_serving
from haste_hf.cli import main
from haste_hf.export import ONNX_FILE_LIMIT_BYTES, _check_against_model, _example_inputs, _graph_bytes, choose_layout
from haste_hf.labels.layout import LabelLayout
from haste_hf.metrics import (
    AMAZON_PROPENSITY_PARAMETERS,
    DEFAULT_PROPENSITY_PARAMETERS,
    WIKIPEDIA_PROPENSITY_PARAMETERS,
    filter_top_k,
    propensity_parameters,
)
from haste_hf.modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES
from haste_hf.onnx_serving import output_layer_topk
from haste_hf.training import run_lock
from haste_hf.training.optimization import StochasticRoundingSGD
from haste_hf.training.run_lock import LOCK_FILE, OutputDirInUseError, output_dir_lock


model_dir, single_export = test_export.model_dir, test_export.single_export  # the fixtures: a saved model, its export


def common(dataset_dir):
    return ["--data", str(dataset_dir), "--max-length", "6", "--eval-batch-size", "16"]


# ------------------------------------------------------------------------------------- validation hold-out


def test_group_and_train_hold_out_the_same_seeded_validation_points(dataset_dir, encoder_dir, tmp_path):
    """`group` and `train --layout-file` split off the same validation points (fraction and seed), or `train`
    refuses the layout as one of another training split."""
    layout_file = tmp_path / "layout.safetensors"
    split = ["--validation-fraction", "0.25", "--seed", "7"]
    group = ["group", *common(dataset_dir), "--encoder", str(encoder_dir), "--output", str(layout_file)]
    assert main([*group, "--group-size", "4", "--grouping", "frequency", *split]) == 0
    train = ["train", *common(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(tmp_path / "model")]
    assert main([*train, "--max-steps", "1", "--fan-in", "8", "--layout-file", str(layout_file), *split]) == 0
    model = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert torch.equal(model.output_layer.output_labels, LabelLayout.load(layout_file).output_labels())


# ------------------------------------------------------------------------------------- the ONNX export


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


# ------------------------------------------------------------------------------------- the run lock


def plant_lock(folder, pid, host=None):
    folder.mkdir(parents=True, exist_ok=True)
    record = {"pid": pid, "host": host or socket.gethostname(), "started": "then"}
    (folder / LOCK_FILE).write_text(json.dumps(record))


def test_a_restarted_job_with_its_old_pid_takes_its_own_stale_lock_over(tmp_path):
    """In a container a restarted job often gets the pid its previous run had: a lock naming this very process,
    held by no one, is stale, not another run's."""
    folder = tmp_path / "out"
    plant_lock(folder, os.getpid())
    with CaptureLogger(run_lock.logger) as captured, output_dir_lock(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert "taking over the lock of process" in captured.out


@pytest.mark.skipif(run_lock.fcntl is None, reason="no OS file locks: the owner's pid alone decides")
@pytest.mark.parametrize("content", ["not json", json.dumps({"pid": 1, "host": "elsewhere"})])
def test_the_os_lock_alone_refuses_a_second_run(tmp_path, content):
    """A run holding the OS lock is refused whatever its file says (it may not have written it yet, or names a pid
    this host cannot ask about)."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(content)
    holder = os.open(folder / LOCK_FILE, os.O_RDWR)  # another open file description: flock conflicts with it
    try:
        run_lock.fcntl.flock(holder, run_lock.fcntl.LOCK_EX | run_lock.fcntl.LOCK_NB)
        with (
            pytest.raises(OutputDirInUseError, match="is being written by another training run"),
            output_dir_lock(folder),
        ):
            pass
    finally:
        os.close(holder)
    with output_dir_lock(folder):  # released: taken over
        pass


# ------------------------------------------------------------------------------------- bf16 momentum


def test_a_bf16_momentum_of_float32_weights_is_rounded_stochastically():
    """1 + 2^-9 lies a quarter of the way from bf16's 1 to its next value: rounded to nearest, every buffer entry
    would be 1; rounded stochastically, a quarter of them are 1 + 2^-7 and the mean stays 1 + 2^-9."""
    param = nn.Parameter(torch.zeros(1 << 14))
    param.grad = torch.full_like(param, 1 + 2**-9)
    optimizer = StochasticRoundingSGD([param], lr=0.5, momentum=0.9, momentum_dtype=torch.bfloat16)
    optimizer.step()
    buffer = optimizer.state[param]["momentum_buffer"]
    assert buffer.dtype == torch.bfloat16 and param.dtype == torch.float32
    assert set(buffer.float().unique().tolist()) == {1.0, 1 + 2**-7}
    assert abs(buffer.float().mean().item() - (1 + 2**-9)) < 2e-4
    assert torch.equal(param.data, torch.full_like(param, -0.5 * (1 + 2**-9)))  # the weights: exact float32


# ------------------------------------------------------------------------------------- label names in config.json


def test_config_json_names_labels_up_to_exactly_10000():
    assert MAX_CONFIG_LABEL_NAMES == 10_000
    encoder = tiny_encoder_config("bert")
    at_limit = HasteConfig(encoder=encoder, label_count=10_000, head_label_count=10, fan_in=8)
    at_limit.set_label_names([f"tag {i}" for i in range(10_000)])
    assert at_limit.to_dict()["id2label"][9_999] == "tag 9999" and len(at_limit.label2id) == 10_000
    past = HasteConfig(encoder=encoder, label_count=10_001, head_label_count=10, fan_in=8)
    past.set_label_names([f"tag {i}" for i in range(10_001)])
    assert "id2label" not in past.to_dict() and "label2id" not in past.to_dict()


# ------------------------------------------------------------------------------------- metrics


@pytest.mark.parametrize(
    "name, preset",
    [
        ("Wiki-LSHTC", WIKIPEDIA_PROPENSITY_PARAMETERS),
        ("wiki_lshtc_325k", WIKIPEDIA_PROPENSITY_PARAMETERS),
        ("Amazon-Cat-13K", DEFAULT_PROPENSITY_PARAMETERS),
        ("amazon_cat", DEFAULT_PROPENSITY_PARAMETERS),
        ("LF-Amazon-131K", AMAZON_PROPENSITY_PARAMETERS),
    ],
)
def test_propensity_presets_match_names_written_with_separators(name, preset):
    assert propensity_parameters(name) == preset


def test_filter_top_k_skips_a_missing_candidate_before_a_real_one():
    top_ids = np.array([[-1, 5, 3, 8], [4, -1, -1, 2]])
    kept = filter_top_k(top_ids, np.array([[1, 2]]), k=2)
    np.testing.assert_array_equal(kept, [[5, 3], [4, -1]])  # row 1: label 2 is filtered, nothing else is left
