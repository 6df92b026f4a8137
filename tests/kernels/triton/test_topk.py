# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`haste_hf.kernels.triton.topk` against the float64 reference (GPU, or CPU through Triton's interpreter)."""

import pytest
import torch
from kernel_operands import make_layer, reference_logits

from haste_hf.kernels.triton import topk


def check(shape, dtype, device, k, valid_count, seed):
    x, weight, supports, bias = make_layer(*shape, dtype, device, seed)
    scores, columns = topk.group_sparse_topk(x, weight, supports, bias, k, valid_count)
    assert scores.shape == columns.shape == (shape[0], k)
    assert scores.dtype == torch.float32 and columns.dtype == torch.int64
    logits = reference_logits(x, weight, supports, bias).to(dtype).float().cpu()[:, :valid_count]
    expected, _ = logits.topk(min(k, valid_count), dim=1)
    scores, columns = scores.cpu(), columns.cpu()
    scored = expected.shape[1]
    # Scores: the reference's, best first (a logit may round to the neighbouring 16-bit value: fp32 sums differ).
    spacing = {torch.bfloat16: 2**-6, torch.float16: 2**-9, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(scores[:, :scored], expected, atol=spacing * expected.abs().max().item(), rtol=0)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    # Columns: distinct, scored, and each one's logit is its score.
    assert (columns[:, :scored] >= 0).all() and (columns[:, :scored] < valid_count).all()
    assert all(len(set(row.tolist())) == scored for row in columns[:, :scored])
    at_columns = logits.gather(1, columns[:, :scored])
    torch.testing.assert_close(at_columns, scores[:, :scored], atol=spacing * expected.abs().max().item(), rtol=0)
    # A row with fewer than k scored columns ends in (-inf, -1).
    assert (scores[:, scored:] == float("-inf")).all() and (columns[:, scored:] == -1).all()


@pytest.mark.parametrize(
    "shape, dtype, k, valid_count",
    [
        ((19, 96, 40, 32, 64), torch.bfloat16, 5, 1270),
        ((33, 100, 3, 16, 32), torch.float16, 70, 40),  # more than the scored columns: padded
        ((9, 40, 6, 5, 7), torch.float32, 3, 30),
    ],
    ids=["bf16-k5", "fp16-k70", "fp32-k3"],
)
def test_matches_reference(device, shape, dtype, k, valid_count):
    check(shape, dtype, device, k, valid_count, seed=k)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("k", [1, 5, 40])
def test_matches_reference_on_gpu(dtype, k):
    check((300, 768, 3000, 32, 64), dtype, "cuda", k, 3000 * 32 - 20, seed=k)
