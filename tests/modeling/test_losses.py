# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The loss seam (haste_hf.modeling.losses): the per-logit losses, the chunked output-layer loss against the unfused
float64 reference, and on a GPU the fused `haste::linear_loss` op and the fused top-k."""

import pytest
import torch
import torch.nn.functional as F
from kernel_operands import relative_error
from loss_reference import dense_targets, make_layer, random_positions, reference
from tiny_haste import make_tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.kernels import ops as kernels
from haste_hf.modeling import losses, sparse_ops
from haste_hf.modeling.output_layer import output_labels_from_frequencies, random_supports


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def run(function, x, weight, bias, supports, positions, valid_count, scale, loss):
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, weight, bias)]
    value = function(leaves[0], leaves[1], leaves[2], positions, valid_count, scale, loss, supports=supports)
    value.backward()
    return value.detach(), [leaf.grad if leaf is not None else None for leaf in leaves]


# ------------------------------------------------------------------------------------------------
# CPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_each_loss_returns_its_derivative(loss):
    logits = (torch.randn(64, dtype=torch.float64) * 4).requires_grad_()
    targets = (torch.rand(64, dtype=torch.float64) < 0.5).double()
    terms, grad = losses.LOSSES[loss](logits, targets)
    (autograd,) = torch.autograd.grad(terms.sum(), logits)
    torch.testing.assert_close(grad, autograd)
    assert torch.all(terms >= 0)


def test_losses_match_their_closed_forms():
    logits = torch.tensor([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    ones, zeros = torch.ones_like(logits), torch.zeros_like(logits)
    torch.testing.assert_close(losses.bce(logits, ones)[0], torch.log1p(torch.exp(-logits)))
    torch.testing.assert_close(
        losses.squared_hinge(logits, ones)[0], torch.tensor([16.0, 2.25, 1.0, 0.25, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        losses.squared_hinge(logits, zeros)[0], torch.tensor([0.0, 0.25, 1.0, 2.25, 16.0], dtype=torch.float64)
    )


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("kind", ["dense", "sparse"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("with_bias", [True, False])
def test_chunked_loss_equals_the_unfused_reference(loss, kind, dtype, with_bias, monkeypatch):
    monkeypatch.setattr(losses, "_LOSS_CHUNK_ELEMENTS", 6 * 8)  # several chunks, the last one ragged
    batch, outputs, valid_count = 6, 44, 41  # the last group has 3 padding slots
    x, weight, bias, supports = make_layer(kind, batch, 10, outputs, dtype, bias=with_bias)
    positions = random_positions(batch, outputs)
    scale = 1.0 / batch
    expected, expected_grads = reference(x, weight, bias, supports, positions, valid_count, scale, loss)
    value, grads = run(losses.output_layer_loss, x, weight, bias, supports, positions, valid_count, scale, loss)
    tolerance = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 1e-5}
    assert value.dtype == dtype
    torch.testing.assert_close(value.double(), expected, **tolerance)
    for grad, expected_grad in zip(grads, expected_grads):
        if expected_grad is not None:
            torch.testing.assert_close(grad.double(), expected_grad, **tolerance)


def test_chunked_loss_in_bfloat16_is_the_reference_on_rounded_logits(monkeypatch):
    monkeypatch.setattr(losses, "_LOSS_CHUNK_ELEMENTS", 64)
    x, weight, bias, supports = make_layer("sparse", 5, 12, 32, torch.bfloat16, group_size=8, fan_in=4)
    positions = random_positions(5, 32)
    value, grads = run(losses.output_layer_loss, x, weight, bias, supports, positions, 30, 0.2, "bce")
    logits = sparse_ops.group_sparse_linear(x, weight, supports, bias)[:, :30].double()
    expected = F.binary_cross_entropy_with_logits(logits, dense_targets(positions, 30), reduction="sum") * 0.2
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=0)
    _, expected_grads = reference(x, weight, bias, supports, positions, 30, 0.2, "bce")
    for grad, expected_grad in zip(grads, expected_grads):
        assert ((grad.double() - expected_grad).norm() / expected_grad.norm()).item() < 2e-2


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_a_bfloat16_layers_input_gradient_sums_its_many_chunks_in_float32(kind):
    """4096 outputs in 512 chunks of 8, every logit's gradient of one sign (BCE on negatives above 0): each chunk's
    part of the input gradient is a bf16 product, summed over the chunks in float32. A bf16 sum would round at
    each of the 512 additions (relative error ~1e-2); the float32 one leaves the rounding of the bf16 operands and
    of each chunk's product (about 2^-9 = 2e-3 each, not adding up)."""
    x, weight, bias, supports = make_layer(kind, 4, 16, 4096, torch.bfloat16, group_size=8, fan_in=4)
    bias = (bias.float().abs() + 3).bfloat16()
    positions = random_positions(4, 4096)
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    losses.chunk_loss_backward_(leaves[1], 8)
    value = losses.output_layer_loss(leaves[0], leaves[1], leaves[2], positions, 4096, 0.25, "bce", supports=supports)
    value.backward()
    _, expected = reference(x, weight, bias, supports, positions, 4096, 0.25, "bce")
    assert relative_error(leaves[0].grad, expected[0]) < 5e-3
    assert relative_error(leaves[2].grad, expected[2]) < 5e-3


def test_positions_outside_the_layer_are_not_positives():
    x, weight, bias, supports = make_layer("sparse", 3, 10, 16, torch.float64)
    clean = torch.tensor([[2, 5, -1, -1], [0, -1, -1, -1], [-1, -1, -1, -1]])
    noisy = torch.tensor([[2, 5, 5, 14], [0, -7, 15, 99], [-1, 13, -100, 16]])  # repeats, padding slots 13..15, past
    for positions in (clean, noisy):
        value = losses.output_layer_loss(x, weight, bias, positions, 13, 1.0, supports=supports)
        torch.testing.assert_close(value, reference(x, weight, bias, supports, clean, 13, 1.0, "bce")[0])


def test_targets_of_a_chunk_count_each_position_of_the_layer_once():
    positions = torch.tensor([[4, 4, 6, -1, 7], [5, 9, 2, 8, -100]])
    targets = losses.targets_of_chunk(positions, 4, 8, 7, torch.float32)  # columns 4..7, 7 is padding
    assert targets.tolist() == [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]]


def test_chunked_loss_never_holds_a_batch_by_outputs_tensor(monkeypatch):
    """The CPU path's memory is bounded by the chunk, whatever the number of outputs."""
    monkeypatch.setattr(losses, "_LOSS_CHUNK_ELEMENTS", 16 * 64)
    batch, outputs = 16, 4096
    x, weight, bias, supports = make_layer("sparse", batch, 32, outputs, torch.float32, group_size=8, fan_in=4)
    x.requires_grad_()
    weight.requires_grad_()
    positions = random_positions(batch, outputs)

    class LargestOutput(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            for tensor in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and tensor.shape[0] == batch:
                    LargestOutput.largest = max(LargestOutput.largest, tensor.shape[1])
            return result

    with LargestOutput():
        losses.output_layer_loss(x, weight, None, positions, outputs, 1.0, supports=supports).backward()
    assert 0 < LargestOutput.largest <= 64 * 4  # a chunk of logits or gathered features, never [B, 4096]


def test_output_layer_loss_rejects_bad_arguments():
    x, weight, bias, supports = make_layer("dense", 3, 10, 8, torch.float32)
    with pytest.raises(ValueError, match="`loss`"):
        losses.output_layer_loss(x, weight, bias, torch.zeros(3, 1, dtype=torch.long), 8, 1.0, loss="hinge")
    with pytest.raises(ValueError, match="`positions`"):
        losses.output_layer_loss(x, weight, bias, torch.zeros(4, 1, dtype=torch.long), 8, 1.0)


def test_chunked_loss_traces_without_graph_breaks():
    x, weight, bias, supports = make_layer("sparse", 4, 10, 16, torch.float32)
    weight.requires_grad_()
    positions = random_positions(4, 16)

    def step(weight):
        return losses.output_layer_loss(x, weight, bias, positions, 15, 0.25, supports=supports)

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    (grad,) = torch.autograd.grad(compiled(weight), weight)
    (expected,) = torch.autograd.grad(step(weight), weight)
    torch.testing.assert_close(grad, expected)


def tiny_model(loss="bce", reduction="sum", label_count=50):
    fields = dict(loss=loss, loss_reduction=reduction, tail_bias=True, shuffle_labels=True, training=False)
    return make_tiny_model(label_count, head_label_count=5, **fields)


@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_model_loss_is_the_configured_loss_of_label_order_logits(loss, reduction):
    model = tiny_model(loss, reduction, label_count=51)  # padding slots in the last tail group
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 90, (4, 7), generator=generator)
    labels = torch.tensor([[3, 50, 3, -100], [0, 1, 2, 49], [-100] * 4, [7, -100, -100, -100]])
    loss_value = model(input_ids, labels=labels).loss
    logits = model(input_ids).logits.double()
    expected_terms, _ = losses.LOSSES[loss](logits, dense_targets(labels, 51))
    scale = 1 / (4 * (51 if reduction == "mean" else 1))
    torch.testing.assert_close(loss_value.double(), expected_terms.sum() * scale, rtol=1e-5, atol=1e-7)
    # The unfused reference (`compute_loss` on position logits) agrees, gradients included.
    fused_grads, reference_grads = [], []
    for use_fused, grads in ((True, fused_grads), (False, reference_grads)):
        model.zero_grad()
        pooled = model.encode(input_ids)[0]
        head_x, tail_x = model.output_layer.branch_inputs(pooled)
        layer = model.output_layer
        value = layer.loss(pooled, labels) if use_fused else layer.reference_loss(layer.position_logits(pooled), labels)
        value.backward()
        grads.extend(
            p.grad.clone()
            for p in (model.output_layer.head.weight, model.output_layer.tail.weight, model.output_layer.tail.bias)
        )
    for fused, expected in zip(fused_grads, reference_grads):
        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-7)


def test_config_names_the_losses_of_the_seam():
    from haste_hf.modeling import configuration_haste

    assert tuple(losses.LOSSES) == configuration_haste.LOSSES
    with pytest.raises(ValueError, match="`loss`"):
        tiny_model(loss="hinge")


def test_label_mapping_needs_no_host_synchronization():
    """The label-id check must not read a device value back per step: under `fullgraph=True` any host
    synchronization (`bool(tensor)`) would fail the trace."""
    model = tiny_model()
    labels = torch.tensor([[3, 49, -100], [0, -100, -100]])
    compiled = torch.compile(model.output_layer.positive_positions, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(labels), model.output_layer.positive_positions(labels))
    with pytest.raises(ValueError, match="outside"):
        model.output_layer.positive_positions(torch.tensor([[50, -100]]))  # eager CPU tensors are still checked
    with pytest.raises(ValueError, match="outside"):
        model.output_layer.positive_positions(torch.tensor([[-3, 1]]))


# ------------------------------------------------------------------------------------------------
# GPU: the fused op and the fused top-k
# ------------------------------------------------------------------------------------------------
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def poison_allocator(*shapes, dtype):
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device="cuda") for shape in shapes]
    del blocks


def fused(x, weight, bias, positions, valid_count, scale, loss, supports):
    return kernels.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss)


# (kind, B, d, outputs, G, F, dtype): tensor-core tails (ragged batches, G = 16 / 32, F = 32 / 64), a tail
# off the tensor-core path, dense heads in each dtype.
GPU_CASES = [
    ("sparse", 70, 96, 5 * 32, 32, 64, torch.bfloat16),
    ("sparse", 33, 130, 7 * 16, 16, 32, torch.float16),
    ("sparse", 129, 64, 9 * 16, 16, 64, torch.bfloat16),
    ("sparse", 9, 40, 6 * 5, 5, 7, torch.float32),
    ("dense", 70, 96, 300, None, None, torch.bfloat16),
    ("dense", 33, 48, 77, None, None, torch.float32),
]


@gpu
@pytest.mark.parametrize(
    "case", GPU_CASES, ids=lambda case: f"{case[0]}-B{case[1]}-n{case[3]}-{case[6]}".replace("torch.", "")
)
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_fused_loss_matches_the_float64_reference(case, loss):
    assert kernels.is_available()
    kind, batch, features, outputs, group_size, fan_in, dtype = case
    x, weight, bias, supports = make_layer(
        kind, batch, features, outputs, dtype, "cuda", group_size=group_size, fan_in=fan_in, seed=batch
    )
    positions = random_positions(batch, outputs, positives=9, seed=outputs).cuda()
    valid_count, scale = outputs - 3, 1.0 / batch
    poison_allocator((batch, outputs), (batch * outputs,), dtype=dtype)
    value, grads = run(fused, x, weight, bias, supports, positions, valid_count, scale, loss)
    expected, expected_grads = reference(x, weight, bias, supports, positions, valid_count, scale, loss)
    assert torch.isfinite(value)
    assert relative_error(value, expected) < TOLERANCE[dtype] / 2
    for grad, expected_grad in zip(grads, expected_grads):
        assert torch.isfinite(grad).all()
        assert relative_error(grad, expected_grad) < TOLERANCE[dtype], relative_error(grad, expected_grad)
    # Against the chunked path on the same device: logits rounded alike up to a few last-bit flips.
    chunked = losses._ChunkedLinearLoss.apply(
        x, weight, bias, supports, positions, valid_count, scale, loss, None, None, False
    )
    assert relative_error(value, chunked) < 1e-3
    # Reproducible sums; without autograd nothing is stored and the loss is the same.
    assert torch.equal(kernels.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss), value)
    with torch.no_grad():
        assert torch.equal(kernels.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss), value)


@gpu
def test_fused_tail_loss_stores_the_scaled_logit_gradient_and_no_logits():
    x, weight, bias, supports = make_layer("sparse", 65, 96, 4 * 32, torch.bfloat16, "cuda", 32, 64)
    positions = random_positions(65, 128).cuda()
    poison_allocator((65, 128), dtype=torch.bfloat16)
    value, grad_logits = torch.ops.haste.linear_loss(
        x, weight, bias, supports, positions, 120, 0.25, "bce", True, False
    )
    logits = sparse_ops.group_sparse_linear(x, weight, supports, bias).float()
    targets = dense_targets(positions.cpu(), 128).cuda().float()
    expected = ((torch.sigmoid(logits) - targets) * 0.25).masked_fill(torch.arange(128, device="cuda") >= 120, 0.0)
    torch.testing.assert_close(grad_logits.float(), expected.bfloat16().float(), rtol=0, atol=2e-3)
    assert kernels.fuses_loss(x, weight, supports)


@gpu
def test_fused_loss_traces_without_graph_breaks():
    x, weight, bias, supports = make_layer("sparse", 64, 96, 4 * 32, torch.bfloat16, "cuda", 32, 64)
    weight.requires_grad_()
    positions = random_positions(64, 128).cuda()

    def step(weight):
        return losses.output_layer_loss(x, weight, bias, positions, 128, 1 / 64, supports=supports)

    compiled = torch.compile(step, fullgraph=True)
    (grad,) = torch.autograd.grad(compiled(weight), weight)
    (expected,) = torch.autograd.grad(step(weight), weight)
    torch.testing.assert_close(grad, expected)


@gpu
@pytest.mark.parametrize("shape", [(70, 96, 7, 32, 64, 5), (33, 130, 9, 16, 32, 1), (300, 64, 40, 16, 64, 37)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_topk_matches_topk_of_the_logits(shape, dtype):
    batch, features, groups, group_size, fan_in, k = shape
    x, weight, bias, supports = make_layer(
        "sparse", batch, features, groups * group_size, dtype, "cuda", group_size, fan_in, seed=k
    )
    valid_count = groups * group_size - 2
    scores, columns = sparse_ops.group_sparse_topk(x, weight, supports, bias, k, valid_count)
    logits = sparse_ops.group_sparse_linear(x, weight, supports, bias).float()[:, :valid_count]
    expected = logits.topk(k, dim=1)
    torch.testing.assert_close(scores, expected.values, rtol=0, atol=0)
    assert torch.all(columns < valid_count)
    # Same ids up to ties: every returned column holds its score, and rows whose k + 1 best scores are
    # distinct (no tie inside the top k nor at its boundary) have the reference's columns.
    torch.testing.assert_close(logits.gather(1, columns), scores, rtol=0, atol=0)
    best = logits.topk(k + 1, dim=1).values
    distinct = (best[:, 1:] != best[:, :-1]).all(dim=1)
    assert torch.equal(columns[distinct], expected.indices[distinct])


@gpu
def test_model_on_gpu_fused_step_predict_and_cuda_build():
    from tiny_encoders import tiny_encoder_config

    config = HasteConfig(
        encoder=tiny_encoder_config("bert"),
        label_count=1000,
        head_label_count=30,
        group_size=32,
        fan_in=32,
        tail_bias=True,
        tail_projection_dim=64,
    )
    with torch.device("cuda"):
        model = HasteForExtremeClassification(config).eval()  # no dropout: both losses see one encoding
    cpu_supports = random_supports(config.tail_group_count, config.fan_in, config.tail_input_dim, config.supports_seed)
    assert model.output_layer.tail.supports.is_cuda and torch.equal(
        model.output_layer.tail.supports.cpu(), cpu_supports
    )
    model.output_layer.output_labels.copy_(output_labels_from_frequencies(config, torch.randperm(1000)))
    for module in (model.output_layer.head, model.output_layer.tail):
        module.to(torch.bfloat16)
    input_ids = torch.randint(4, 90, (40, 9), device="cuda")
    labels = torch.randint(0, 1000, (40, 6), device="cuda")
    labels[::3, 3:] = -100
    output = model(input_ids, labels=labels)
    output.loss.backward()
    fused_grad = model.output_layer.tail.weight.grad.clone()
    model.zero_grad()
    reference_loss = model.output_layer.reference_loss(
        model.output_layer.position_logits(model.encode(input_ids)[0]), labels
    )
    reference_loss.backward()
    assert relative_error(output.loss, reference_loss) < 1e-4
    assert relative_error(fused_grad, model.output_layer.tail.weight.grad) < 1e-2
    with torch.no_grad():
        top = model.predict_topk(input_ids, k=5)
        logits = model(input_ids).logits.float()
        top_forward = model(input_ids, labels=labels, top_k=5)
    torch.testing.assert_close(top.scores, logits.topk(5).values, rtol=0, atol=0)
    torch.testing.assert_close(logits.gather(1, top.label_ids), top.scores, rtol=0, atol=0)
    assert torch.equal(top_forward.top_label_ids, top.label_ids)


@gpu
def test_validation_mode_checks_label_ids_on_the_device(monkeypatch):
    from haste_hf.modeling import label_positions

    model = tiny_model().cuda()
    monkeypatch.setattr(label_positions, "VALIDATE_LABELS", True)
    with pytest.raises(ValueError, match="outside"):
        model.output_layer.positive_positions(torch.tensor([[50, -100]], device="cuda"))


@gpu
def test_fused_loss_under_autocast_computes_in_the_layers_dtype():
    x, weight, bias, supports = make_layer("dense", 24, 40, 90, torch.float32, "cuda")
    positions = random_positions(24, 90).cuda()
    expected = kernels.linear_loss(x, weight, bias, None, positions, 90, 1.0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        value, grads = run(losses.output_layer_loss, x, weight, bias, None, positions, 90, 1.0, "bce")
    torch.testing.assert_close(value, expected)
    assert all(grad.dtype == torch.float32 for grad in grads)


@gpu
@pytest.mark.parametrize("loss", sorted(losses.LOSSES))
def test_fused_loss_is_accurate_over_the_whole_logit_range(loss):
    """Logits from -40 to 40 (saturated sigmoids, log1p of tiny exponentials) through the fused kernels'
    loss, against float64."""
    x = torch.linspace(-40, 40, 24 * 512, dtype=torch.float32, device="cuda").view(24, 512)
    weight = torch.eye(512, device="cuda")
    positions = random_positions(24, 512, positives=40).cuda()
    value = kernels.linear_loss(x, weight, None, None, positions, 500, 1.0, loss)
    expected, _ = reference(x, weight, None, None, positions, 500, 1.0, loss)
    assert relative_error(value, expected) < 1e-6
