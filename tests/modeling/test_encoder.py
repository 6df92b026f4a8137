"""`haste_hf.modeling.encoder`: what each encoder block runs, checkpointed or not."""

import types

import pytest
import torch
from torch import nn

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
