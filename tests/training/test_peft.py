"""LoRA on the encoder of a HASTE model with peft: HasteTrainer trains it (output layer in full), the adapter and the
merged model save and reload; the shapes whose checkpoints would not reload are refused."""

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from tiny_encoders import VOCAB_SIZE, planted_texts, tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer
from transformers import AutoModel, TrainerCallback

from haste_hf import HasteForExtremeClassification
from haste_hf.metrics import make_compute_metrics
from haste_hf.training.optimization import unwrap_haste_optimizer
from haste_hf.training.peft_utils import output_layer_modules


LABELS = 40
LORA_TARGETS = ["query", "value"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A saved HASTE base model: the base every adapter names."""
    folder = tmp_path_factory.mktemp("base")
    make_tiny_model(label_count=LABELS, tail_projection_dim=16).save_pretrained(folder)
    return folder


def lora_model(base_dir, **lora_overrides):
    base = HasteForExtremeClassification.from_pretrained(base_dir)
    fields = dict(r=4, lora_alpha=8, target_modules=LORA_TARGETS, modules_to_save=output_layer_modules(base))
    fields.update(lora_overrides)
    return get_peft_model(base, LoraConfig(**fields))


def make_trainer(output_dir, model, tokenizer, **overrides):
    training = dict(
        per_device_train_batch_size=8,
        max_steps=6,
        learning_rate=1e-2,
        output_learning_rate=0.5,
        rewiring_interval=2,
        rewiring_end_fraction=1.0,
        save_strategy="no",
        eval_dataset=Dataset.from_list(planted_texts(LABELS, 16, seed=1)),
        compute_metrics=make_compute_metrics(ks=(1, 3)),
    )
    train_dataset = Dataset.from_list(planted_texts(LABELS, 48, seed=0))
    return make_tiny_trainer(output_dir, tokenizer, train_dataset, model, **{**training, **overrides})


def batch():
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(5, VOCAB_SIZE, (4, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 5:] = 0
    return input_ids, attention_mask


def logits(model):
    with torch.no_grad():
        return model.eval()(*batch(), return_logits=True).logits


@pytest.fixture(scope="module")
def trained(base_dir, tokenizer, tmp_path_factory):
    model = lora_model(base_dir)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    trainer = make_trainer(tmp_path_factory.mktemp("run"), model, tokenizer)
    trainer.train()
    return trainer, before


def test_lora_trains_the_encoder_adapters_and_the_whole_output_layer(trained):
    trainer, before = trained
    model = trainer.model
    after = model.state_dict()
    changed = {name for name, tensor in before.items() if not torch.equal(tensor, after[name])}
    assert any("lora_B" in name for name in changed)
    # The encoder's own weights and the frozen originals of the output layer stay as loaded.
    assert not any(".base_layer." in name or "original_module" in name for name in changed)
    assert not any(name.startswith("base_model.model.encoder.") and "lora_" not in name for name in changed)
    copies = {"head": "head.modules_to_save.default.", "tail": "tail.modules_to_save.default."}
    for prefix in copies.values():
        assert any(prefix + "weight" in name for name in changed), prefix
    assert any("tail.modules_to_save.default.supports" in name for name in changed)  # rewired
    # Head and tail train with the output layer's SGD, the LoRA weights and the projection with AdamW.
    optimizer = unwrap_haste_optimizer(trainer.optimizer)
    haste = model.get_base_model()
    output_params = {id(p) for group in optimizer.output_optimizer.param_groups for p in group["params"]}
    trained_copies = [
        haste.output_layer.head.modules_to_save["default"],
        haste.output_layer.tail.modules_to_save["default"],
    ]
    assert output_params == {id(p) for module in trained_copies for p in module.parameters()}
    encoder_params = {id(p) for group in optimizer.encoder_optimizer.param_groups for p in group["params"]}
    assert encoder_params == {id(p) for p in model.parameters() if p.requires_grad} - output_params
    assert id(haste.output_layer.tail_projection.modules_to_save["default"].weight) in encoder_params
    rewirings = [entry for entry in trainer.state.log_history if "rewired_pairs" in entry]
    assert [entry["step"] for entry in rewirings] == [2, 4, 6]
    assert {"eval_P@1", "eval_P@3"} <= set(trainer.evaluate())


def test_adapter_saves_and_reloads(trained, base_dir, tmp_path):
    trainer, _ = trained
    trainer.save_model(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    # LoRA weights and the whole output layer (the rewired supports too), not the encoder's own weights.
    assert {
        "base_model.model.output_layer.tail.weight",
        "base_model.model.output_layer.tail.supports",
        "base_model.model.output_layer.head.weight",
    } <= set(saved)
    assert any("lora_A" in name for name in saved)
    assert not any(".base_layer." in name or name.endswith("word_embeddings.weight") for name in saved)
    expected = logits(trainer.model)
    reloaded = PeftModel.from_pretrained(HasteForExtremeClassification.from_pretrained(base_dir), tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded), expected, rtol=0, atol=0)
    # transformers finds the adapter too, and loads it onto the base it names.
    direct = AutoModel.from_pretrained(tmp_path / "adapter")
    torch.testing.assert_close(logits(direct), expected, rtol=1e-5, atol=1e-5)


def test_merged_model_saves_and_reloads_as_a_plain_haste_model(trained, base_dir, tmp_path):
    trainer, _ = trained
    expected = logits(trainer.model)
    # Merged from a reloaded copy: merging in place would change the trainer's model, which other tests read.
    trainer.save_model(tmp_path / "adapter")
    peft_model = PeftModel.from_pretrained(
        HasteForExtremeClassification.from_pretrained(base_dir), tmp_path / "adapter"
    )
    merged = peft_model.merge_and_unload()
    assert type(merged) is HasteForExtremeClassification
    torch.testing.assert_close(logits(merged), expected, rtol=1e-5, atol=1e-5)
    merged.save_pretrained(tmp_path / "merged")
    reloaded = AutoModel.from_pretrained(tmp_path / "merged")
    assert type(reloaded) is HasteForExtremeClassification
    torch.testing.assert_close(logits(reloaded), logits(merged), rtol=0, atol=0)
    assert torch.equal(reloaded.output_layer.tail.supports, trainer.model.get_base_model().output_layer.tail.supports)


def test_resuming_from_an_adapter_checkpoint_repeats_the_uninterrupted_run(base_dir, tokenizer, tmp_path):
    """Rewiring at steps 2, 4, 6 and a checkpoint at step 3: LoRA weights, head, tail and supports match bit for bit."""

    class StopAt3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 3

    def run(output_dir, callbacks=(), resume=None):
        torch.manual_seed(1)  # LoRA's own initialisation, before the trainer seeds
        trainer = make_trainer(output_dir, lora_model(base_dir), tokenizer, save_strategy="steps", save_steps=3)
        for callback in callbacks:
            trainer.add_callback(callback)
        trainer.train(resume_from_checkpoint=resume)
        return trainer.model.state_dict()

    uninterrupted = run(tmp_path / "full")
    run(tmp_path / "resumed", [StopAt3()])
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "resumed" / "checkpoint-3"))
    assert uninterrupted.keys() == resumed.keys()
    for name, tensor in uninterrupted.items():
        assert torch.equal(tensor, resumed[name]), name


def test_lora_on_the_encoder_alone_is_refused_and_its_checkpoints_do_not_load_silently(base_dir, tokenizer, tmp_path):
    model = HasteForExtremeClassification.from_pretrained(base_dir)
    model.encoder = get_peft_model(model.encoder, LoraConfig(r=4, target_modules=LORA_TARGETS))
    with pytest.raises(ValueError, match="Wrap the whole model instead"):
        make_trainer(tmp_path / "run", model, tokenizer)
    with pytest.raises(ValueError, match="merge_and_unload"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model").exists()
    # A checkpoint written that way before (the encoder under the adapter's names) no longer loads with a random
    # encoder and no word.
    plain = HasteForExtremeClassification.from_pretrained(base_dir)
    plain.save_pretrained(tmp_path / "old")
    state = load_file(tmp_path / "old" / "model.safetensors")
    renamed = {
        name.replace("encoder.", "encoder.base_model.model.", 1) if name.startswith("encoder.") else name: tensor
        for name, tensor in state.items()
    }
    save_file(renamed, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lacks \d+ weights.*encoder\.embeddings.*encoder\.base_model\.model"):
        HasteForExtremeClassification.from_pretrained(tmp_path / "old")
    # Merged first, it saves and reloads.
    model.encoder = model.encoder.merge_and_unload()
    model.save_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(AutoModel.from_pretrained(tmp_path / "merged")), logits(model), rtol=0, atol=0)


def test_peft_models_whose_adapters_would_not_reload_are_refused(base_dir, tokenizer, tmp_path):
    frozen_output = lora_model(base_dir, modules_to_save=["tail"])
    with pytest.raises(
        ValueError, match=r"leaves \['output_layer.head', 'output_layer.tail_projection'\] frozen.*modules_to_save"
    ):
        make_trainer(tmp_path / "a", frozen_output, tokenizer)
    unsaved_base = HasteForExtremeClassification.from_encoder_pretrained(
        AutoModel.from_config(tiny_encoder_config("bert")), LABELS, head_label_count=4, group_size=4, fan_in=8
    )
    unsaved = get_peft_model(
        unsaved_base, LoraConfig(r=4, target_modules=LORA_TARGETS, modules_to_save=["head", "tail"])
    )
    with pytest.raises(ValueError, match="base HASTE model was never saved"):
        make_trainer(tmp_path / "b", unsaved, tokenizer)


def test_the_lora_path_prints_no_deprecation_or_pinning_warning(base_dir, tokenizer, tmp_path):
    """peft reads the deprecated `is_gradient_checkpointing`; a CPU run cannot pin memory: neither warns."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = lora_model(base_dir)
        make_trainer(tmp_path, model, tokenizer, max_steps=1, use_cpu=False, eval_strategy="no").train()
    noise = [
        str(warning.message)
        for warning in caught
        if "is_gradient_checkpointing" in str(warning.message) or "pin_memory" in str(warning.message)
    ]
    assert not noise, noise


def test_no_model_is_a_peft_model_where_peft_is_not_installed(monkeypatch):
    from haste_hf.training import peft_utils

    model = make_tiny_model()
    monkeypatch.setattr(peft_utils, "is_peft_available", lambda: False)
    assert peft_utils.is_peft_model(model) is False
