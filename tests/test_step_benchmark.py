# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""benchmarks/step.py's SDPA path of MPNet's attention against transformers' eager one, on the CPU."""

import copy
import functools

import torch
from benchmark_scripts import load_benchmark
from tiny_haste import make_tiny_model
from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention


def test_sdpa_attention_of_mpnet_gives_the_eager_outputs_and_gradients():
    step = load_benchmark("step")
    eager = make_tiny_model(encoder="mpnet").eval()  # no dropout: both draw the same (no) masks
    sdpa = copy.deepcopy(eager)
    patched = [module for module in sdpa.modules() if isinstance(module, MPNetSelfAttention)]
    assert patched
    for module in patched:
        module.forward = functools.partial(step.mpnet_sdpa_attention, module)
    torch.manual_seed(0)
    input_ids = torch.randint(5, 100, (3, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0  # padding: the mask joins the position bias
    labels = torch.tensor([[1, 5, -100], [2, -100, -100], [0, 3, 7]])
    results = []
    for model in (eager, sdpa):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        results.append(
            (loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
        )
    torch.testing.assert_close(results[1][0], results[0][0])
    assert set(results[1][1]) == set(results[0][1])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)
