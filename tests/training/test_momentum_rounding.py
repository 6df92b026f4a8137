"""bf16 momentum of float32 weights is stored by stochastic rounding (mutation testing dropped the buffer's dtype
from the rounding decision unnoticed)."""

import torch
from torch import nn

from haste_hf.training.optimization import StochasticRoundingSGD


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
