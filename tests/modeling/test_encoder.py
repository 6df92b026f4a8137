"""`haste_hf.modeling.encoder`: what each encoder block runs, checkpointed or not; the load reports shown."""

import types

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_encoders import tiny_encoder_config
from torch import nn
from transformers import BertModel
from transformers.testing_utils import CaptureLogger

from haste_hf.modeling.encoder import checkpointed_forward


class Block(nn.Module):
    def forward(self, x):
        return 2 * x


@pytest.mark.parametrize(
    "checkpointing, training, grad, recomputed",
    [
        (True, True, True, True),
        (True, False, True, False),  # evaluation keeps no activations anyway
        (True, True, False, False),  # under no_grad there is no backward to recompute for
        (False, True, True, False),
    ],
)
def test_a_block_recomputes_its_forward_only_when_checkpointing_in_training_with_gradients(
    checkpointing, training, grad, recomputed
):
    block = Block().train(training)
    block.gradient_checkpointing = checkpointing
    calls = []
    block._gradient_checkpointing_func = lambda forward, *args: calls.append(1) or forward(*args)
    block.forward = types.MethodType(checkpointed_forward, block)
    x = torch.randn(3, generator=torch.Generator().manual_seed(0))
    with torch.set_grad_enabled(grad):
        assert torch.equal(block(x), 2 * x)
    assert calls == ([1] if recomputed else [])


def load_report(folder, **kwargs) -> str:
    """What loading the encoder of `folder` prints of transformers' load report."""
    from transformers.utils import logging

    from haste_hf.modeling.encoder import load_pretrained_encoder

    library_logger = logging.get_logger("transformers")
    logging.enable_propagation()
    try:
        with CaptureLogger(library_logger) as captured:
            load_pretrained_encoder(str(folder), **kwargs)
    finally:
        logging.disable_propagation()
    return captured.out


def test_a_load_report_about_the_pooler_alone_is_held_and_any_other_is_shown(tmp_path, capfd):
    BertModel(tiny_encoder_config("bert")).save_pretrained(tmp_path)  # with its pooler
    assert "LOAD REPORT" not in load_report(tmp_path, add_pooling_layer=False) + capfd.readouterr().err
    weights = load_file(tmp_path / "model.safetensors")
    del weights["embeddings.word_embeddings.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    shown = load_report(tmp_path, add_pooling_layer=False) + capfd.readouterr().err
    assert "LOAD REPORT" in shown and "word_embeddings" in shown
