"""`from_pretrained(..., device_map=...)`: a model offloaded to the CPU or the disk, or split over two GPUs, predicts
(logits, top-k, pipeline) and computes its loss as the whole model does; its backward runs (where accelerate lets an
offloaded model train).

The offloading tests run on the CPU (disk offload); the split over two GPUs needs them:
`pytest -q tests/test_device_map.py -m gpu` on a machine with 2 GPUs."""

import pytest
import torch
from tiny_encoders import tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import pipeline

from haste_hf import HasteForExtremeClassification, HasteTextClassificationPipeline


LABELS = 40
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("device_map") / "model"
    model = make_tiny_model(label_count=LABELS, shuffle_labels=True, training=False)
    model.set_label_names([f"tag{i}" for i in range(LABELS)])
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder, model


def batch(label_count=LABELS, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 100, (4, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    attention_mask[3, 2:] = 0
    labels = torch.randint(0, label_count, (4, 3), generator=generator)
    labels[0, 1:] = -100
    return input_ids, attention_mask, labels


def assert_serves_as(model, reference, label_count=LABELS, device="cpu"):
    """`model` (placed by a device map) predicts and scores as `reference` (whole, on the CPU), and trains."""
    input_ids, attention_mask, labels = batch(label_count)
    on_device = [tensor.to(device) for tensor in (input_ids, attention_mask, labels)]
    model.eval()
    with torch.no_grad():
        expected = reference(input_ids, attention_mask, labels=labels, return_logits=True)
        output = model(*on_device[:2], labels=on_device[2], return_logits=True)
        torch.testing.assert_close(output.logits.cpu(), expected.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(output.loss.cpu(), expected.loss, rtol=1e-4, atol=1e-4)
        assert torch.equal(output.top_label_ids.cpu(), expected.top_label_ids)
        top = model.predict_topk(*on_device[:2], k=5)
        expected_top = reference.predict_topk(input_ids, attention_mask, k=5)
        assert torch.equal(top.label_ids.cpu(), expected_top.label_ids)
        torch.testing.assert_close(top.scores.cpu(), expected_top.scores, rtol=1e-4, atol=1e-4)
    loss = model.train()(*on_device[:2], labels=on_device[2]).loss  # the loss's value is checked above, in eval
    loss.backward()
    # Offloaded weights are brought for the forward only: those that stay placed train.
    placed = [param for param in model.parameters() if param.device.type != "meta"]
    assert torch.isfinite(loss) and all(param.grad is not None for param in placed)


@pytest.mark.parametrize(
    "device_map",
    [
        {"encoder": "cpu", "dropout": "cpu", "output_layer": "disk"},
        {"encoder": "disk", "dropout": "cpu", "output_layer": "cpu"},
        "auto",  # with a CPU too small for anything: the whole model on the disk
    ],
)
def test_offloaded_to_the_disk(saved, tmp_path, device_map):
    folder, reference = saved
    model = HasteForExtremeClassification.from_pretrained(
        folder, device_map=device_map, max_memory={"cpu": "10KB"}, offload_folder=str(tmp_path / "offload")
    )
    assert "disk" in model.hf_device_map.values()
    assert_serves_as(model, reference)


def test_an_offloaded_model_serves_the_top_k_pipeline(saved, tmp_path):
    folder, reference = saved
    classifier = pipeline(
        "text-classification",
        model=str(folder),
        device_map={"encoder": "cpu", "dropout": "cpu", "output_layer": "disk"},
        model_kwargs={"offload_folder": str(tmp_path / "offload")},
        pipeline_class=HasteTextClassificationPipeline,
    )
    whole = pipeline("text-classification", model=reference, tokenizer=classifier.tokenizer)
    texts = ["w1 w2 w3", "w7 w8"]
    for served, expected in zip(classifier(texts, top_k=3), whole(texts, top_k=3)):
        assert [item["label"] for item in served] == [item["label"] for item in expected]


def test_the_output_layer_is_never_split(saved):
    """transformers reads `_no_split_modules` (also to run its model-parallel tests): the output layer's forward reads
    its weights itself, the encoder's blocks are the encoder's own."""
    _, model = saved
    assert "HasteOutputLayer" in model._no_split_modules and "BertLayer" in model._no_split_modules


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("offload_output_layer", [False, True])
def test_split_over_two_gpus(tmp_path, offload_output_layer):
    """A model larger than one GPU's allowance (`max_memory`) loads split over two, and serves as it does whole; the
    output layer offloaded to the CPU too."""
    encoder = tiny_encoder_config("bert")
    encoder.num_hidden_layers, encoder.hidden_size, encoder.intermediate_size = 8, 256, 1024
    label_count = 20_000
    reference = make_tiny_model(
        label_count=label_count, head_label_count=200, group_size=16, fan_in=32, encoder=encoder
    )
    reference.save_pretrained(tmp_path / "model")
    reference = reference.eval()
    size = sum(tensor.numel() * tensor.element_size() for tensor in reference.state_dict().values())
    encoder_size = sum(tensor.numel() * tensor.element_size() for tensor in reference.encoder.state_dict().values())
    # GPU 0 takes half the model (the first encoder blocks), GPU 1 the rest, or, at half the encoder's size, all but
    # the last block, which goes to the CPU with the output layer.
    max_memory = {0: size // 2, 1: encoder_size // 2 if offload_output_layer else size, "cpu": 4 * size}
    model = HasteForExtremeClassification.from_pretrained(
        tmp_path / "model", device_map="auto", max_memory=max_memory, dtype=torch.float32
    )
    placed = set(model.hf_device_map.values())
    assert {0, 1} <= placed and (("cpu" in placed) == offload_output_layer), model.hf_device_map
    assert_serves_as(model, reference, label_count=label_count, device="cuda:0")
