"""The memory options of training at 10^7+ labels: encoder activation checkpointing, bf16 momentum of the output
layer, the output layer's loss backward in label chunks (no stored `[B, L]` logit gradient) and the SGD update
fused into it (no stored weight gradient)."""

import copy
import functools
import gzip
import json

import pytest
import torch
from datasets import Dataset
from kernel_operands import relative_error
from loss_reference import make_layer, random_positions, reference
from tiny_encoders import (
    FAMILIES,
    VOCAB_SIZE,
    planted_texts,
    tiny_encoder_config,
    tiny_tokenizer,
)
from tiny_haste import make_tiny_model, make_tiny_trainer

from haste_hf import HasteForExtremeClassification
from haste_hf.kernels import ops as kernels
from haste_hf.modeling import losses
from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.optimization import StochasticRoundingSGD
from haste_hf.training.trainer import HasteTrainer
from haste_hf.training.training_args import HasteTrainingArguments


LABELS = 40


def batch(seed=3):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB_SIZE, (4, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 5:] = 0
    labels = torch.tensor([[0, 7, -100], [3, 21, 39], [5, -100, -100], [12, 30, 1]])
    return input_ids, attention_mask, labels


def gradients(model, seed=5):
    torch.manual_seed(seed)  # the same dropout masks in both runs (checkpointing replays the RNG state)
    model.zero_grad(set_to_none=True)
    model(*batch()[:2], labels=batch()[2]).loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}


# ---------------------------------------------------------------------------------- activation checkpointing


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_reaches_the_encoder_of_every_family_with_the_same_gradients(family):
    reference = gradients(make_tiny_model(LABELS, encoder=family))
    model = make_tiny_model(LABELS, encoder=family)
    model.gradient_checkpointing_enable()  # the name every transformers 5.x has
    assert model.is_gradient_checkpointing
    blocks = [module for module in model.encoder.modules() if getattr(module, "gradient_checkpointing", False)]
    assert blocks, "no encoder module checkpoints its activations"
    calls = []
    layer = next(
        module
        for module in blocks
        if not isinstance(module, torch.nn.ModuleList)
        and len(list(module.children())) > 0
        and type(module).__name__.endswith(("Layer", "Block"))
    )
    # On a sublayer: the block's own hooks sit outside the checkpoint, and a recompute may stop before a forward ends.
    next(layer.children()).register_forward_pre_hook(lambda *_: calls.append(True))
    checkpointed = gradients(model)
    assert len(calls) == 2, "the checkpointed block did not recompute its forward in the backward"
    assert checkpointed.keys() == reference.keys()
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    model.gradient_checkpointing_disable()
    assert not model.is_gradient_checkpointing
    calls.clear()
    gradients(model)
    assert len(calls) == 1


def test_checkpointing_every_second_block_of_an_encoder_without_its_own():
    encoder = tiny_encoder_config("mpnet")
    encoder.num_hidden_layers = 4
    model = make_tiny_model(LABELS, encoder=encoder)
    reference = gradients(model)
    model.gradient_checkpointing_enable(every_n_layers=2)
    assert [layer.gradient_checkpointing for layer in model.encoder.encoder.layer] == [True, False, True, False]
    calls = {index: [] for index in range(4)}
    for index, layer in enumerate(model.encoder.encoder.layer):
        layer.attention.register_forward_pre_hook(lambda *_, index=index: calls[index].append(1))
    torch.testing.assert_close(gradients(model), reference, rtol=1e-5, atol=1e-6)
    assert [len(calls[index]) for index in range(4)] == [2, 1, 2, 1]
    model.gradient_checkpointing_disable()
    assert [layer.gradient_checkpointing for layer in model.encoder.encoder.layer] == [False] * 4


def test_checkpointed_model_copies_and_saves_as_a_plain_one(tmp_path):
    model = make_tiny_model(LABELS, encoder="mpnet")
    model.gradient_checkpointing_enable()  # the name every transformers 5.x has
    duplicate = copy.deepcopy(model)
    layer = duplicate.encoder.encoder.layer[0]
    assert layer.forward.__self__ is layer  # the copy's blocks run their own weights, not the original's
    torch.testing.assert_close(gradients(duplicate), gradients(model))
    model.save_pretrained(tmp_path)
    reloaded = HasteForExtremeClassification.from_pretrained(tmp_path).train()
    assert not reloaded.is_gradient_checkpointing
    torch.testing.assert_close(gradients(reloaded), gradients(model), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dataset")
    for name, rows in (("trn", planted_texts(LABELS, 48, seed=0)), ("tst", planted_texts(LABELS, 16, seed=1))):
        with gzip.open(path / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(rows):
                f.write(
                    json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}) + "\n"
                )
    with gzip.open(path / "lbl.json.gz", "wt") as f:
        for label in range(LABELS):
            f.write(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n")
    return path


def test_train_flag_checkpoints_the_encoder_during_training(dataset_dir, tmp_path, monkeypatch):
    from transformers import MPNetModel

    from haste_hf.cli import main

    encoder_dir = tmp_path / "mpnet"  # a family whose transformers code has no checkpointing of its own
    MPNetModel(tiny_encoder_config("mpnet")).save_pretrained(encoder_dir)
    tiny_tokenizer(encoder_dir)

    seen = []
    original = HasteTrainer.compute_loss

    def spy(self, model, *args, **kwargs):
        encoder = unwrap_model(model).encoder
        seen.append([layer.gradient_checkpointing for layer in encoder.encoder.layer])
        return original(self, model, *args, **kwargs)

    monkeypatch.setattr(HasteTrainer, "compute_loss", spy)
    assert (
        main(
            [
                "train",
                "--data",
                str(dataset_dir),
                "--encoder",
                str(encoder_dir),
                "--output-dir",
                str(tmp_path / "out"),
                "--max-steps",
                "2",
                "--batch-size",
                "16",
                "--group-size",
                "4",
                "--fan-in",
                "8",
                "--max-length",
                "6",
                "--gradient_checkpointing",
            ]
        )
        == 0
    )
    assert seen and all(flags == [True] for flags in seen)


def test_peft_model_trains_with_gradient_checkpointing(tmp_path, tokenizer):
    from peft import LoraConfig, get_peft_model

    from haste_hf.training.peft_utils import output_layer_modules

    base = make_tiny_model(LABELS, encoder="mpnet")
    base.save_pretrained(tmp_path / "base")
    base = HasteForExtremeClassification.from_pretrained(tmp_path / "base")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q", "v"], modules_to_save=output_layer_modules(base)))
    lora = {name: param.clone() for name, param in model.named_parameters() if "lora_B" in name}
    trainer = make_tiny_trainer(
        tmp_path / "run",
        tokenizer,
        Dataset.from_list(planted_texts(LABELS, 24, seed=0)),
        model,
        per_device_train_batch_size=8,
        max_steps=3,
        learning_rate=1e-2,
        save_strategy="no",
        gradient_checkpointing=True,
    )
    trainer.train()
    assert unwrap_model(model).is_gradient_checkpointing
    assert any(not torch.equal(param, lora[name]) for name, param in model.named_parameters() if name in lora)


# ---------------------------------------------------------------------------------- bf16 momentum


def momentum_run(momentum_dtype, seed, steps=6, rows=64):
    """Weights and momentum of a bf16 parameter after `steps` SGD steps on a fixed sequence of gradients."""
    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(rows, 8, generator=generator).to(torch.bfloat16))
    optimizer = StochasticRoundingSGD(
        [param], lr=0.05, momentum=0.9, weight_decay=1e-4, momentum_dtype=momentum_dtype, seed=seed
    )
    for _ in range(steps):
        param.grad = (torch.randn(rows, 8, generator=generator) * 1e-2).to(torch.bfloat16)
        optimizer.step()
    return param.detach().float(), optimizer.state[param]["momentum_buffer"]


def test_bfloat16_momentum_is_unbiased_and_steps_as_float32_momentum_does():
    runs32 = [momentum_run(torch.float32, seed=seed) for seed in range(200)]
    buffer32 = runs32[0][1]
    runs = [momentum_run(torch.bfloat16, seed=seed) for seed in range(200)]
    assert all(buffer.dtype == torch.bfloat16 for _, buffer in runs)
    ulp = 2.0 ** (torch.frexp(buffer32.abs().max())[1].item() - 8)  # of the largest momentum entry
    # One run: within a couple of bf16 roundings of the float32-momentum run.
    for _, buffer in runs[:5]:
        assert (buffer.float() - buffer32).abs().max() <= 2 * ulp
    # The weights (stochastically rounded either way) agree in expectation to a fraction of their own ulp.
    weights32 = torch.stack([weights for weights, _ in runs32]).mean(0)
    weights16 = torch.stack([weights for weights, _ in runs]).mean(0)
    weight_ulp = 2.0 ** (torch.frexp(weights32)[1] - 8).float()
    assert ((weights16 - weights32).abs() <= 0.5 * weight_ulp).all()
    # Averaged over the random bits, the buffer is the float32 one: the rounding has no bias (rounded to
    # nearest, entries sit up to half an ulp of their own away, 0.25 of this one here).
    mean = torch.stack([buffer.float() for _, buffer in runs]).mean(0)
    assert (mean - buffer32).abs().max() <= 0.1 * ulp
    assert (buffer32.to(torch.bfloat16).float() - buffer32).abs().max() > 0.2 * ulp


def test_output_momentum_dtype_reaches_the_head_and_tail_optimizer_state(tmp_path, tokenizer):
    model = make_tiny_model(LABELS)
    trainer = make_tiny_trainer(
        tmp_path,
        tokenizer,
        Dataset.from_list(planted_texts(LABELS, 16, seed=0)),
        model,
        per_device_train_batch_size=8,
        max_steps=2,
        save_strategy="no",
        output_layer_dtype="bfloat16",
        output_momentum_dtype="bfloat16",
    )
    trainer.train()
    state = trainer.optimizer.state
    for weight in (model.output_layer.head.weight, model.output_layer.tail.weight):
        assert state[weight]["momentum_buffer"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="`output_momentum_dtype`"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_momentum_dtype="float16")


# ---------------------------------------------------------------------------------- chunked backward, fused update

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (kind, B, d, outputs, G, F): a tail whose chunks cut no group in two, a dense head.
LAYERS = [("sparse", 6, 20, 9 * 4, 4, 3), ("dense", 5, 12, 23, None, None)]


def chunked_run(
    x, weight, bias, supports, positions, valid_count, scale, loss, chunk_labels, update=None, upstream=1.0
):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    losses.chunk_loss_backward_(leaves[1], chunk_labels, None if update is None else update(leaves[1]))
    value = losses.output_layer_loss(
        leaves[0], leaves[1], leaves[2], positions, valid_count, scale, loss, supports=supports
    )
    (value * upstream).backward()
    return value.detach(), leaves


@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer[0])
@pytest.mark.parametrize("chunk_labels", [1, 7, 8, 1000])
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_chunked_backward_matches_the_float64_reference(layer, chunk_labels, loss):
    kind, batch, features, outputs, group_size, fan_in = layer
    x, weight, bias, supports = make_layer(
        kind, batch, features, outputs, torch.float64, group_size=group_size, fan_in=fan_in
    )
    positions = random_positions(batch, outputs)
    valid_count, scale, upstream = outputs - 2, 0.5, 3.0
    value, leaves = chunked_run(
        x, weight, bias, supports, positions, valid_count, scale, loss, chunk_labels, upstream=upstream
    )
    expected, expected_grads = reference(x, weight, bias, supports, positions, valid_count, scale, loss)
    torch.testing.assert_close(value, expected)
    for leaf, expected_grad in zip(leaves, expected_grads):
        torch.testing.assert_close(leaf.grad, expected_grad * upstream)


class LoggedUpdates:
    """`update` that records the rows it is given and the weights the feature gradient had read by then."""

    def __init__(self, optimizer):
        self.optimizer, self.rows = optimizer, []

    def __call__(self, param):
        def update(rows, grad):
            self.rows.append((rows.start, rows.stop))
            self.optimizer.update_rows_(param, rows, grad)

        return update


def sgd_steps(kind, dtype, fused: bool, chunk_labels=8, steps=3, momentum_dtype=torch.float32):
    """Weights, bias, momentum and feature gradients after `steps` SGD steps of one layer on its loss."""
    batch, features, outputs, group_size, fan_in = (6, 20, 9 * 4, 4, 3) if kind == "sparse" else (5, 12, 23, None, None)
    x, weight, bias, supports = make_layer(kind, batch, features, outputs, dtype, group_size=group_size, fan_in=fan_in)
    weight, bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)
    optimizer = StochasticRoundingSGD(
        [weight, bias], lr=0.5, momentum=0.9, weight_decay=0.01, momentum_dtype=momentum_dtype
    )
    logged = LoggedUpdates(optimizer)
    if fused:
        losses.chunk_loss_backward_(weight, chunk_labels, logged(weight))
    feature_grads = []
    for step in range(steps):
        leaf = x.detach().clone().requires_grad_()
        positions = random_positions(batch, outputs, seed=step)
        losses.output_layer_loss(leaf, weight, bias, positions, outputs - 2, 0.5, "bce", supports=supports).backward()
        assert (weight.grad is None) == fused
        feature_grads.append(leaf.grad)
        optimizer.step()
        optimizer.zero_grad()
    return weight.detach(), bias.detach(), optimizer.state[weight]["momentum_buffer"], feature_grads, logged.rows


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_fused_update_gives_the_weights_of_the_unfused_step(kind):
    expected = sgd_steps(kind, torch.float32, fused=False)
    weight, bias, buffer, feature_grads, rows = sgd_steps(kind, torch.float32, fused=True)
    units = expected[0].shape[0]
    chunk = 2 if kind == "sparse" else 8  # 8 labels: 2 groups of 4, or 8 dense rows
    assert rows == [(start, min(start + chunk, units)) for start in range(0, units, chunk)] * 3
    torch.testing.assert_close(weight, expected[0])
    torch.testing.assert_close(bias, expected[1])
    torch.testing.assert_close(buffer, expected[2])
    # Each step's feature gradient read the weights before that step's update.
    for grad, expected_grad in zip(feature_grads, expected[3]):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("momentum_dtype", [torch.float32, torch.bfloat16])
def test_fused_update_of_bfloat16_weights_matches_to_bfloat16_rounding(momentum_dtype):
    expected = sgd_steps("sparse", torch.bfloat16, fused=False, momentum_dtype=momentum_dtype)
    weight, _, buffer, _, _ = sgd_steps("sparse", torch.bfloat16, fused=True, momentum_dtype=momentum_dtype)
    assert buffer.dtype == momentum_dtype
    # Stochastic rounding draws other bits per chunk: a few bf16 steps apart at most.
    torch.testing.assert_close(weight.float(), expected[0].float(), rtol=2**-5, atol=2**-8)
    assert relative_error(weight, expected[0]) < 2e-2


def test_default_chunks_hold_a_fixed_number_of_logit_gradient_elements(monkeypatch):
    """`chunk_labels=0`: as many labels as make `DEFAULT_LOSS_CHUNK_ELEMENTS` at the batch size, so a sharded
    layer scoring N times the texts takes N times fewer labels a chunk."""
    monkeypatch.setattr(losses, "DEFAULT_LOSS_CHUNK_ELEMENTS", 6 * 8)  # batch 6: 8 labels, 2 groups of 4
    _, _, _, _, rows = sgd_steps("sparse", torch.float32, fused=True, chunk_labels=0, steps=1)
    assert rows == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9)]
    monkeypatch.setattr(losses, "DEFAULT_LOSS_CHUNK_ELEMENTS", 6 * 16)
    _, _, _, _, rows = sgd_steps("sparse", torch.float32, fused=True, chunk_labels=0, steps=1)
    assert rows == [(0, 4), (4, 8), (8, 9)]


def test_chunk_loss_backward_refuses_a_bad_chunk_and_is_undone_by_none():
    weight = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(ValueError, match="`chunk_labels`"):
        losses.chunk_loss_backward_(weight, -1)
    losses.chunk_loss_backward_(weight, 2)
    losses.chunk_loss_backward_(weight, None)
    assert not hasattr(weight, "_haste_chunked_backward")


def train_tiny(tmp_path, tokenizer, **overrides):
    model = make_tiny_model(LABELS)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    fields = dict(
        per_device_train_batch_size=8,
        max_steps=5,
        learning_rate=1e-2,
        output_learning_rate=0.5,
        rewiring_interval=2,
        rewiring_end_fraction=1.0,
        save_strategy="no",
        max_grad_norm=1.0,
    )
    train_set = Dataset.from_list(planted_texts(LABELS, 40, seed=0))
    trainer = make_tiny_trainer(tmp_path, tokenizer, train_set, model, **{**fields, **overrides})
    trainer.train()
    return trainer


def test_trainer_with_chunked_backward_and_fused_update_trains_as_without(tmp_path, tokenizer):
    expected = train_tiny(tmp_path / "plain", tokenizer)
    chunked = train_tiny(tmp_path / "chunked", tokenizer, output_chunked_backward=True, output_loss_chunk_labels=3)
    fused = train_tiny(tmp_path / "fused", tokenizer, output_loss_chunk_labels=3, output_fused_update=True)
    assert fused.state.log_history[-1]["train_loss"] == pytest.approx(
        expected.state.log_history[-1]["train_loss"], rel=1e-4
    )
    assert any("rewired_pairs" in entry for entry in fused.state.log_history)
    for trainer in (chunked, fused):
        for name, param in expected.model.named_parameters():
            torch.testing.assert_close(
                dict(trainer.model.named_parameters())[name], param, rtol=1e-4, atol=1e-5, msg=name
            )
        torch.testing.assert_close(trainer.model.output_layer.tail.supports, expected.model.output_layer.tail.supports)
    for name in ("head", "tail"):
        weight, expected_weight = (
            getattr(fused.model.output_layer, name).weight,
            getattr(expected.model.output_layer, name).weight,
        )
        state, expected_state = fused.optimizer.state[weight], expected.optimizer.state[expected_weight]
        assert weight.grad is None and state["step"] == expected_state["step"] == 5
        torch.testing.assert_close(state["momentum_buffer"], expected_state["momentum_buffer"], rtol=1e-4, atol=1e-6)
    # Once training ends, the model's backward is its own again: no update through the trainer's optimizer.
    model = fused.model
    model.zero_grad(set_to_none=True)
    model.train()(*batch()[:2], labels=batch()[2]).loss.backward()
    assert model.output_layer.tail.weight.grad is not None and model.output_layer.head.weight.grad is not None


@pytest.mark.parametrize(
    "overrides,named",
    [
        (dict(gradient_accumulation_steps=2), "gradient_accumulation_steps"),
        (dict(output_max_grad_norm=1.0, max_grad_norm=1.0), "output_max_grad_norm"),
        (dict(on_non_finite="skip"), "on_non_finite"),
        (dict(fp16=True, bf16=False, use_cpu=False), "fp16"),  # bf16 off: on a GPU it may be on by default
    ],
)
def test_fused_update_refuses_what_needs_the_whole_gradient(tmp_path, overrides, named):
    with pytest.raises(ValueError, match=f"`{named}"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_fused_update=True, **overrides)
    with pytest.raises(ValueError, match="`output_loss_chunk_labels`"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_loss_chunk_labels=-1)


# (kind, B, d, outputs, G, F, dtype): tensor-core tails (a ragged batch, G = 16 / 32), a dense head, an fp32 tail
# off the tensor-core path (its chunks run on the PyTorch path).
GPU_LAYERS = [
    ("sparse", 70, 96, 13 * 32, 32, 64, torch.bfloat16),
    ("sparse", 129, 130, 11 * 16, 16, 32, torch.float16),
    ("dense", 70, 96, 300, None, None, torch.bfloat16),
    ("sparse", 9, 40, 6 * 5, 5, 7, torch.float32),
]
GPU_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@gpu
@pytest.mark.parametrize("layer", GPU_LAYERS, ids=lambda layer: f"{layer[0]}-{layer[6]}".replace("torch.", ""))
@pytest.mark.parametrize("chunk_labels", [32, 100, 1 << 20])
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_chunked_backward_on_the_kernels_matches_the_fused_op_and_the_float64_reference(
    layer, chunk_labels, loss, monkeypatch
):
    kind, batch, features, outputs, group_size, fan_in, dtype = layer
    x, weight, bias, supports = make_layer(
        kind, batch, features, outputs, dtype, "cuda", group_size=group_size, fan_in=fan_in, seed=batch
    )
    positions = random_positions(batch, outputs, positives=9, seed=outputs).cuda()
    valid_count, scale = outputs - 3, 1.0 / batch
    calls = []
    recompute = kernels.linear_loss_gradient
    monkeypatch.setattr(kernels, "linear_loss_gradient", lambda *args: calls.append(1) or recompute(*args))
    value, leaves = chunked_run(
        x, weight, bias, supports, positions, valid_count, scale, loss, chunk_labels, upstream=2.0
    )
    units = weight.shape[0]
    per_chunk = max(1, chunk_labels // (group_size or 1))
    on_kernels = kernels.fuses_loss(x, weight, supports)
    assert len(calls) == (-(-units // per_chunk) if on_kernels else 0)
    expected, expected_grads = reference(x, weight, bias, supports, positions, valid_count, scale, loss)
    assert relative_error(value, expected) < GPU_TOLERANCE[dtype] / 2
    for leaf, expected_grad in zip(leaves, expected_grads):
        assert torch.isfinite(leaf.grad).all()
        assert relative_error(leaf.grad, expected_grad * 2.0) < GPU_TOLERANCE[dtype], relative_error(
            leaf.grad, expected_grad * 2.0
        )
    if on_kernels:  # and the unchunked fused op, in the same dtype
        fused_leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
        fused_value = kernels.linear_loss(
            fused_leaves[0], fused_leaves[1], fused_leaves[2], supports, positions, valid_count, scale, loss
        )
        (fused_value * 2.0).backward()
        assert torch.equal(value, fused_value.detach())
        for leaf, fused_leaf in zip(leaves, fused_leaves):
            assert relative_error(leaf.grad, fused_leaf.grad) < GPU_TOLERANCE[dtype]  # grad_x: a rounding per chunk


@gpu
@pytest.mark.parametrize("kind", ["sparse", "dense"])
@pytest.mark.parametrize("momentum_dtype", [torch.float32, torch.bfloat16])
def test_fused_update_on_cuda_matches_the_unfused_step_to_bfloat16_rounding(kind, momentum_dtype):
    """bf16 weights on the kernels, each chunk's step by the fused Triton SGD: the weights of the unfused step."""
    if kind == "sparse":
        x, weight, bias, supports = make_layer("sparse", 64, 96, 40 * 32, torch.bfloat16, "cuda", 32, 64, seed=1)
    else:
        x, weight, bias, supports = make_layer("dense", 64, 96, 700, torch.bfloat16, "cuda", seed=1)
    results = []
    for fused in (False, True):
        w, b = torch.nn.Parameter(weight.clone()), torch.nn.Parameter(bias.clone())
        optimizer = StochasticRoundingSGD(
            [w, b], lr=0.5, momentum=0.9, weight_decay=0.01, momentum_dtype=momentum_dtype
        )
        if fused:
            losses.chunk_loss_backward_(w, 256, functools.partial(optimizer.update_rows_, w))
        for step in range(3):
            positions = random_positions(
                64, weight.numel() // (weight.shape[-1] if kind == "sparse" else 96), seed=step
            ).cuda()
            losses.output_layer_loss(
                x,
                w,
                b,
                positions,
                w.shape[0] * (w.shape[1] if kind == "sparse" else 1),
                1 / 64,
                "bce",
                supports=supports,
            ).backward()
            assert (w.grad is None) == fused
            optimizer.step()
            optimizer.zero_grad()
        results.append((w.detach().float(), optimizer.state[w]["momentum_buffer"].float()))
    (expected_weight, expected_buffer), (weight_after, buffer_after) = results
    assert not torch.equal(weight_after, weight.float())  # it trained
    assert relative_error(weight_after, expected_weight) < 1e-2  # stochastic rounding: other bits, about an ulp apart
    assert relative_error(buffer_after, expected_buffer) < 2e-2


@gpu
def test_chunked_backward_and_fused_update_bound_the_transient_memory():
    """A tail of 2^18 labels at batch 128: the stored logit gradient alone is 64 MiB, the weight gradient 32 MiB;
    chunks of 2^13 labels keep the backward's extra memory to a few MiB."""
    batch, labels = 128, 1 << 18
    x, weight, _, supports = make_layer("sparse", batch, 768, labels, torch.bfloat16, "cuda", 32, 64, bias=False)
    positions = random_positions(batch, labels, positives=8).cuda()
    weight = torch.nn.Parameter(weight)
    x.requires_grad_()

    def extra_memory():
        weight.grad = x.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        losses.output_layer_loss(x, weight, None, positions, labels, 1 / batch, "bce", supports=supports).backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    logit_gradient = batch * labels * 2
    assert extra_memory() >= logit_gradient  # the measure sees the stored gradient
    optimizer = StochasticRoundingSGD([weight], lr=0.1, momentum=0.9)
    losses.chunk_loss_backward_(weight, 1 << 13, lambda rows, grad: optimizer.update_rows_(weight, rows, grad))
    optimizer.state[weight]["momentum_buffer"] = torch.zeros_like(weight, dtype=torch.float32)  # state, not transient
    assert extra_memory() < logit_gradient / 4
    assert weight.grad is None


def test_memory_options_are_train_flags():
    from haste_hf.cli.parser import parse_args

    training = parse_args(
        [
            "train",
            "--gradient_checkpointing",
            "--output-momentum-dtype",
            "bfloat16",
            "--output-chunked-backward",
            "--output-loss-chunk-labels",
            "4096",
            "--output-fused-update",
            "--use-cpu",
        ]
    ).training
    assert training.gradient_checkpointing and training.output_momentum_dtype == "bfloat16"
    assert (
        training.output_chunked_backward and training.output_loss_chunk_labels == 4096 and training.output_fused_update
    )
