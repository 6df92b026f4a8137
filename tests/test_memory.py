"""The memory options of training at 10^7+ labels: encoder activation checkpointing, bf16 momentum of the output
layer, the output layer's loss backward in label chunks (no stored `[B, L]` logit gradient) and the SGD update
fused into it (no stored weight gradient)."""

import copy
import gzip
import json

import pytest
import torch
from datasets import Dataset
from tiny_encoders import FAMILIES, VOCAB_SIZE, planted_texts, tiny_encoder_config, tiny_tokenizer

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.callbacks import unwrap_model
from haste_hf.data import XMCDataCollator
from haste_hf.trainer import HasteTrainer
from haste_hf.training_args import HasteTrainingArguments


LABELS = 40


def tiny_model(family="bert", seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(encoder=tiny_encoder_config(family), label_count=LABELS, head_label_count=4, group_size=4, fan_in=8)
    fields.update(overrides)
    return HasteForExtremeClassification(HasteConfig(**fields)).train()


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
    reference = gradients(tiny_model(family))
    model = tiny_model(family)
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing
    blocks = [module for module in model.encoder.modules() if getattr(module, "gradient_checkpointing", False)]
    assert blocks, "no encoder module checkpoints its activations"
    calls = []
    layer = next(module for module in blocks if not isinstance(module, torch.nn.ModuleList) and len(list(module.children())) > 0
                 and type(module).__name__.endswith(("Layer", "Block")))  # fmt: skip
    # On a sublayer: the block's own hooks sit outside the checkpoint, and a recompute may stop before a forward ends.
    next(layer.children()).register_forward_pre_hook(lambda *_: calls.append(True))
    checkpointed = gradients(model)
    assert len(calls) == 2, "the checkpointed block did not recompute its forward in the backward"
    assert checkpointed.keys() == reference.keys()
    for name, grad in reference.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    model.activation_checkpointing_disable()
    assert not model.is_activation_checkpointing
    calls.clear()
    gradients(model)
    assert len(calls) == 1


def test_checkpointed_model_copies_and_saves_as_a_plain_one(tmp_path):
    model = tiny_model("mpnet")
    model.activation_checkpointing_enable()
    duplicate = copy.deepcopy(model)
    layer = duplicate.encoder.encoder.layer[0]
    assert layer.forward.__self__ is layer  # the copy's blocks run their own weights, not the original's
    torch.testing.assert_close(gradients(duplicate), gradients(model))
    model.save_pretrained(tmp_path)
    reloaded = HasteForExtremeClassification.from_pretrained(tmp_path).train()
    assert not reloaded.is_activation_checkpointing
    torch.testing.assert_close(gradients(reloaded), gradients(model), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dataset")
    for name, rows in (("trn", planted_texts(LABELS, 48, seed=0)), ("tst", planted_texts(LABELS, 16, seed=1))):
        with gzip.open(path / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}) + "\n")
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
    assert main(["train", "--data", str(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(tmp_path / "out"),
                 "--max-steps", "2", "--batch-size", "16", "--group-size", "4", "--fan-in", "8", "--max-length", "6",
                 "--gradient_checkpointing"]) == 0  # fmt: skip
    assert seen and all(flags == [True] for flags in seen)


def test_peft_model_trains_with_gradient_checkpointing(tmp_path):
    from peft import LoraConfig, get_peft_model

    from haste_hf.peft_utils import output_layer_modules

    base = tiny_model("mpnet")
    base.save_pretrained(tmp_path / "base")
    base = HasteForExtremeClassification.from_pretrained(tmp_path / "base")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q", "v"], modules_to_save=output_layer_modules(base)))
    lora = {name: param.clone() for name, param in model.named_parameters() if "lora_B" in name}
    args = HasteTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, max_steps=3, learning_rate=1e-2,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, gradient_checkpointing=True,
    )  # fmt: skip
    trainer = HasteTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(planted_texts(LABELS, 24, seed=0)),
        data_collator=XMCDataCollator(tiny_tokenizer(tmp_path / "tokenizer"), max_length=16),
    )  # fmt: skip
    trainer.train()
    assert unwrap_model(model).is_activation_checkpointing
    assert any(not torch.equal(param, lora[name]) for name, param in model.named_parameters() if name in lora)


# ---------------------------------------------------------------------------------- bf16 momentum


def momentum_run(momentum_dtype, seed, steps=6, rows=64):
    """Weights and momentum of a bf16 parameter after `steps` SGD steps on a fixed sequence of gradients."""
    from haste_hf.optimization import StochasticRoundingSGD

    generator = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(rows, 8, generator=generator).to(torch.bfloat16))
    optimizer = StochasticRoundingSGD([param], lr=0.05, momentum=0.9, weight_decay=1e-4, momentum_dtype=momentum_dtype, seed=seed)
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


def test_output_momentum_dtype_reaches_the_head_and_tail_optimizer_state(tmp_path):
    model = tiny_model("bert")
    args = HasteTrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=2, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, output_layer_dtype="bfloat16", output_momentum_dtype="bfloat16",
    )  # fmt: skip
    trainer = HasteTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(planted_texts(LABELS, 16, seed=0)),
        data_collator=XMCDataCollator(tiny_tokenizer(tmp_path / "tokenizer"), max_length=16),
    )  # fmt: skip
    trainer.train()
    state = trainer.optimizer.state
    for weight in (model.head.weight, model.tail.weight):
        assert state[weight]["momentum_buffer"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="`output_momentum_dtype`"):
        HasteTrainingArguments(output_dir=str(tmp_path), output_momentum_dtype="float16")
