"""What transformers promises of any model holds for HASTE's: loading from a config and a state dict, config fields
given to `from_pretrained`, re-heading on a new label set, and tracing by `torch.export` and `torch.compile`."""

import pytest
import torch
from tiny_encoders import tiny_encoder_config
from tiny_haste import make_tiny_model
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from haste_hf import HasteConfig, HasteForExtremeClassification


LABELS = 40


def model_without_dropout(training=False):
    """A 40-label model whose training forward is deterministic (no dropout), so that traced and eager runs agree."""
    encoder = tiny_encoder_config("bert")
    encoder.hidden_dropout_prob = encoder.attention_probs_dropout_prob = 0.0
    return make_tiny_model(label_count=LABELS, encoder=encoder, shuffle_labels=True, training=training)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 40-label model with label names, saved; the tiny encoder is 32 features wide."""
    folder = tmp_path_factory.mktemp("contract") / "model"
    model = model_without_dropout()
    model.set_label_names([f"tag{i}" for i in range(LABELS)])
    model.save_pretrained(folder)
    return folder, model


def inputs(seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 100, (3, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    labels = torch.tensor([[1, 30, -100], [2, -100, -100], [39, 0, 17]])
    return input_ids, attention_mask, labels


def test_from_pretrained_none_with_a_config_and_a_state_dict(saved):
    """transformers documents `from_pretrained(None, config=config, state_dict=state_dict)`."""
    _, model = saved
    loaded = HasteForExtremeClassification.from_pretrained(None, config=model.config, state_dict=model.state_dict())
    input_ids, attention_mask, _ = inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.eval()(input_ids, attention_mask).logits, model(input_ids, attention_mask).logits
        )


@pytest.mark.parametrize("given", [{"label_count": 50}, {"num_labels": 50}])
def test_config_fields_given_to_from_pretrained_go_through_the_config(saved, given):
    folder, _ = saved
    config = HasteConfig.from_pretrained(folder, **given)
    assert config.label_count == config.num_labels == 50
    # The 40 saved names describe other labels: none are kept, and the maps cover the 50.
    assert config.label_names is None and len(config.id2label) == 50 and config.id2label[49] == "LABEL_49"
    assert config.head_label_count == 5  # the saved head's share (4 of 40)


def test_an_invalid_field_given_to_from_pretrained_is_refused_as_by_the_constructor(saved):
    folder, _ = saved
    with pytest.raises(ValueError, match=r"`fan_in` \(64\) exceeds the tail's input size \(32\)"):
        HasteConfig.from_pretrained(folder, fan_in=64)
    with pytest.raises(ValueError, match=r"`num_labels` \(50\) and `label_count` \(60\) differ"):
        HasteConfig.from_pretrained(folder, num_labels=50, label_count=60)


@pytest.mark.parametrize("label_count", [50, 39])  # 39 labels fit the saved tensors' shapes, and not their labels
def test_re_heading_needs_ignore_mismatched_sizes(saved, label_count):
    folder, _ = saved
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        HasteForExtremeClassification.from_pretrained(folder, label_count=label_count)


@pytest.mark.parametrize("given", [{"label_count": 50}, {"num_labels": 39}, {"fan_in": 4}])
def test_re_heading_loads_the_encoder_with_a_new_output_layer_and_says_so(saved, given):
    folder, model = saved
    logger = logging.get_logger("transformers.haste_hf.modeling.modeling_haste")
    with CaptureLogger(logger) as captured:
        reheaded = HasteForExtremeClassification.from_pretrained(folder, ignore_mismatched_sizes=True, **given).eval()
    assert "re-headed" in captured.out and "train it before use" in captured.out
    label_count = given.get("label_count", given.get("num_labels", LABELS))
    layer = reheaded.output_layer
    assert reheaded.config.label_count == layer.label_count == label_count and reheaded.label_names is None
    assert layer.fan_in == given.get("fan_in", 8)
    layer.check_invariants()
    expected_labels = torch.full_like(layer.output_labels, -1)
    expected_labels[:label_count] = torch.arange(label_count)
    assert torch.equal(layer.output_labels, expected_labels)  # a fresh layer's, not the shuffled saved one
    for name, tensor in model.encoder.state_dict().items():
        assert torch.equal(reheaded.encoder.state_dict()[name], tensor), name
    input_ids, attention_mask, labels = inputs()
    labels = labels.clamp(max=label_count - 1)
    reheaded.train()(input_ids, attention_mask, labels=labels).loss.backward()
    assert reheaded.output_layer.tail.weight.grad is not None


def exported_outputs(module, kwargs):
    program = torch.export.export(module, (), kwargs)
    return program.module()(**kwargs)


@pytest.mark.slow
def test_torch_export_traces_the_model_in_eval_and_in_training(saved):
    _, model = saved
    input_ids, attention_mask, labels = inputs()
    model = model.eval()
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    with torch.no_grad():
        torch.testing.assert_close(exported_outputs(model, kwargs).logits, model(**kwargs).logits)
        # With labels in eval mode: the loss and the top-k a Trainer's evaluation gathers.
        traced = exported_outputs(model, {**kwargs, "labels": labels})
        eager = model(**kwargs, labels=labels)
        torch.testing.assert_close(traced.loss, eager.loss)
        assert torch.equal(traced.top_label_ids, eager.top_label_ids)
    model.train()
    try:
        traced = exported_outputs(model, {**kwargs, "labels": labels})
        torch.testing.assert_close(traced.loss, model(**kwargs, labels=labels).loss)
    finally:
        model.eval()


@pytest.mark.slow
@pytest.mark.parametrize("training", [False, True])
def test_torch_compile_fullgraph(training):
    """One graph, in eval (logits) and in training (loss and gradients equal to eager's)."""
    model = model_without_dropout(training)
    input_ids, attention_mask, labels = inputs()
    # Eager first, as a user runs a model before compiling it: the label-position map is then cached.
    if not training:
        with torch.no_grad():
            eager = model(input_ids, attention_mask).logits
    else:
        model(input_ids, attention_mask, labels=labels).loss.backward()
        eager = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
        model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    if not training:
        with torch.no_grad():
            torch.testing.assert_close(compiled(input_ids, attention_mask).logits, eager)
        return
    compiled(input_ids, attention_mask, labels=labels).loss.backward()
    traced = {name: param.grad for name, param in model.named_parameters() if param.grad is not None}
    assert traced.keys() == eager.keys()
    for name, grad in eager.items():
        torch.testing.assert_close(traced[name], grad, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16 at G = 16, F = 32: the CUDA kernels' shapes
@pytest.mark.parametrize("training", [False, True])
def test_torch_compile_fullgraph_on_cuda(training, dtype):
    """torch.compile's own backend (inductor), one graph, on the GPU, after an eager call."""
    encoder = tiny_encoder_config("bert")
    encoder.hidden_dropout_prob = encoder.attention_probs_dropout_prob = 0.0
    model = make_tiny_model(label_count=LABELS, group_size=16, fan_in=32, encoder=encoder, training=training)
    model = model.to("cuda", dtype)
    input_ids, attention_mask, labels = (tensor.cuda() for tensor in inputs())
    tolerance = {} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    if not training:
        with torch.no_grad():
            eager = model(input_ids, attention_mask, labels=labels, return_logits=True)
            traced = compiled(input_ids, attention_mask, labels=labels, return_logits=True)
        torch.testing.assert_close(traced.logits, eager.logits, **tolerance)
        torch.testing.assert_close(traced.loss, eager.loss, **tolerance)
        return
    eager_loss = model(input_ids, attention_mask, labels=labels).loss
    eager_loss.backward()
    eager = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    model.zero_grad()
    traced_loss = compiled(input_ids, attention_mask, labels=labels).loss
    traced_loss.backward()
    torch.testing.assert_close(traced_loss, eager_loss, **tolerance)
    for name, grad in eager.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, msg=name, **tolerance)
