import pytest
import torch

from haste_hf.modeling import sparse_ops
from haste_hf.modeling.sparse_ops import group_sparse_linear


def random_problem(batch=5, features=24, groups=6, group_size=4, fan_in=7, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, features, generator=generator, dtype=dtype)
    weight = torch.randn(groups, group_size, fan_in, generator=generator, dtype=dtype)
    supports = torch.stack([torch.randperm(features, generator=generator)[:fan_in] for _ in range(groups)]).int()
    bias = torch.randn(groups * group_size, generator=generator, dtype=dtype)
    return x, weight, supports, bias


def dense_equivalent(weight, supports, features):
    """The tail as a dense `[K * G, d]` matrix: zeros off each group's support."""
    groups, group_size, fan_in = weight.shape
    dense = torch.zeros(groups, group_size, features, dtype=weight.dtype)
    dense.scatter_(2, supports.long().unsqueeze(1).expand(-1, group_size, -1), weight)
    return dense.reshape(groups * group_size, features)


@pytest.mark.parametrize("groups, group_size, fan_in", [(6, 4, 7), (1, 1, 1), (3, 1, 24), (2, 16, 5)])
def test_matches_dense_matrix(groups, group_size, fan_in):
    x, weight, supports, bias = random_problem(groups=groups, group_size=group_size, fan_in=fan_in)
    expected = x @ dense_equivalent(weight, supports, x.shape[1]).T + bias
    torch.testing.assert_close(group_sparse_linear(x, weight, supports, bias), expected)


def test_gradcheck_float64():
    x, weight, supports, bias = random_problem()
    inputs = (x.requires_grad_(), weight.requires_grad_(), bias.requires_grad_())
    assert torch.autograd.gradcheck(lambda x, w, b: group_sparse_linear(x, w, supports, b), inputs)
    assert torch.autograd.gradgradcheck(lambda x, w: group_sparse_linear(x, w, supports), inputs[:2])


def test_gradients_match_dense_autograd():
    x, weight, supports, _ = random_problem(batch=9, groups=11)
    x.requires_grad_()
    weight.requires_grad_()
    grad_out = torch.randn(9, 11 * 4, dtype=torch.float64)
    group_sparse_linear(x, weight, supports).backward(grad_out)
    x_ref = x.detach().clone().requires_grad_()
    weight_ref = weight.detach().clone().requires_grad_()
    (x_ref @ dense_equivalent(weight_ref, supports, 24).T).backward(grad_out)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(weight.grad, weight_ref.grad)


def test_chunked_path_equals_single_chunk(monkeypatch):
    x, weight, supports, _ = random_problem(groups=13)
    x.requires_grad_()
    weight.requires_grad_()
    whole = group_sparse_linear(x, weight, supports)
    whole_grads = torch.autograd.grad(whole.sum(), (x, weight))
    monkeypatch.setattr(sparse_ops, "_GATHER_CHUNK_ELEMENTS", 5 * 7 * 2)  # two groups per chunk
    chunked = group_sparse_linear(x, weight, supports)
    chunked_grads = torch.autograd.grad(chunked.sum(), (x, weight))
    torch.testing.assert_close(chunked, whole)
    for got, expected in zip(chunked_grads, whole_grads):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_low_precision_matches_float64(dtype, tolerance):
    x, weight, supports, bias = random_problem(batch=8, groups=10, group_size=8, fan_in=16)
    expected = group_sparse_linear(x, weight, supports, bias)
    got = group_sparse_linear(x.to(dtype), weight.to(dtype), supports, bias.to(dtype))
    assert got.dtype == dtype
    assert ((got.double() - expected).norm() / expected.norm()).item() < tolerance


def test_only_supported_features_get_gradient():
    x, weight, supports, _ = random_problem(features=40, groups=2, fan_in=3)
    x.requires_grad_()
    group_sparse_linear(x, weight, supports).sum().backward()
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[supports.long().flatten()] = False
    assert torch.all(x.grad[:, untouched] == 0)
    assert torch.all(x.grad[:, ~untouched] != 0)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x, w, s, b: (x[0], w, s, b), "`x` must be 2-D"),
        (lambda x, w, s, b: (x, w[0], s, b), "`weight` must be 3-D"),
        (lambda x, w, s, b: (x, w, s[:, :3], b), "`supports` must have shape"),
        (lambda x, w, s, b: (x, w, s.float(), b), "`supports` must be an integer"),
        (lambda x, w, s, b: (x.float(), w, s, b), "must share a dtype"),
        (lambda x, w, s, b: (x, w, s, b[:-1]), "`bias` must be"),
    ],
)
def test_bad_inputs_raise_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        group_sparse_linear(*change(*random_problem()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_feature_gradient_is_accumulated_in_float32(dtype):
    # 4,096 groups reading F = 32 of d = 64 features: each feature gathers about 2,000 terms, as at large L.
    x, weight, supports, _ = random_problem(batch=8, features=64, groups=4096, group_size=16, fan_in=32, seed=1)
    grad_out = torch.randn(8, 4096 * 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x, weight, grad_out = (tensor.to(dtype) for tensor in (x, weight, grad_out))
    # The reference sums the same (rounded) values in float64: what is left is the error of the summation.
    x64 = x.double().requires_grad_()
    group_sparse_linear(x64, weight.double(), supports).backward(grad_out.double())
    x_low = x.clone().requires_grad_()
    group_sparse_linear(x_low, weight, supports).backward(grad_out)
    assert x_low.grad.dtype == dtype
    error = (x_low.grad.double() - x64.grad).abs().max() / x64.grad.abs().max()
    # One rounding of the result to `dtype` (2^-9 for bf16) is the floor; summing in `dtype` gave 3e-2 to 1e-1.
    assert error < 4 * torch.finfo(dtype).eps, error
