# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""PEFT (LoRA) fine-tuning of HASTE models.

The supported shape wraps the whole HASTE model, LoRA on the encoder and the output layer trained in full:

    from peft import LoraConfig, get_peft_model
    base = HasteForExtremeClassification.from_pretrained("haste-base")   # a saved HASTE model
    model = get_peft_model(base, LoraConfig(target_modules=["query", "value"],
                                            modules_to_save=output_layer_modules(base)))

The head, the tail and the projections are new, randomly initialised layers: they train in full
(`modules_to_save`), with the output layer's SGD for head and tail. Adapter checkpoints hold the LoRA
weights and those modules (tail supports included); the label order (`output_labels`) stays in the base model,
which the adapter names by its folder or Hub id. `model.merge_and_unload()` gives a plain HASTE model.

LoRA on `model.encoder` alone is refused: such a model saves its encoder under the adapter's names, and the
checkpoint would load with a random encoder.

peft is optional: nothing here imports it unless a model holds PEFT modules.
"""

from torch import nn

from ..import_utils import is_peft_available


def output_layer_modules(model: nn.Module) -> list[str]:
    """Names in the HASTE model of its output layer's newly initialised modules (head, tail, projections,
    as `HasteOutputLayer.trained_modules` lists them): the `modules_to_save` of a `LoraConfig` on it."""
    return [f"output_layer.{name}" for name in model.output_layer.trained_modules()]


def is_peft_model(model: nn.Module) -> bool:
    if not is_peft_available():
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def check_peft_model(peft_model: nn.Module, haste_model: nn.Module) -> None:
    """Refuses a `PeftModel` whose adapter checkpoints would not reload: an output layer or projection left
    frozen (it would stay random), or a base model saved nowhere (the adapter could not name it)."""
    # A module in `modules_to_save` keeps a frozen original beside its trained copy.
    frozen = [
        name
        for name in output_layer_modules(haste_model)
        if not any(param.requires_grad for param in haste_model.get_submodule(name).parameters())
    ]
    if frozen:
        raise ValueError(
            f"The PEFT model leaves {frozen} frozen: they are new, randomly initialised layers of the HASTE model and "
            f"must train in full. Add `modules_to_save={output_layer_modules(haste_model)}` to the LoraConfig."
        )
    if not haste_model.name_or_path:
        raise ValueError(
            "The PEFT model's base HASTE model was never saved, so its adapter checkpoints could not name the base "
            "they apply to (its label order, head/tail layout and supports). Save the base first "
            "(`model.save_pretrained('haste-base')`), then build the PeftModel on "
            "`HasteForExtremeClassification.from_pretrained('haste-base')`."
        )


def check_no_peft_encoder(haste_model: nn.Module) -> None:
    """Refuses a HASTE model holding PEFT modules of its own (LoRA put on `model.encoder`)."""
    if any(type(module).__module__.startswith("peft.") for module in haste_model.modules()):
        raise ValueError(
            "The HASTE model holds PEFT modules (e.g. `model.encoder = get_peft_model(model.encoder, ...)`): its "
            "checkpoints would save the encoder under the adapter's names and reload with a random encoder. Wrap the "
            "whole model instead: `get_peft_model(model, LoraConfig(target_modules=[...], "
            "modules_to_save=haste_hf.training.peft_utils.output_layer_modules(model)))`."
        )


__all__ = ["check_no_peft_encoder", "check_peft_model", "is_peft_model", "output_layer_modules"]
