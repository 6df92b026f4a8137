import copy
import io
import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer

from haste_hf.training.optimization import (
    HasteOptimizer,
    HasteScheduler,
    StochasticRoundingSGD,
    get_haste_scheduler,
    stochastic_round_to_bfloat16,
    warmup_steps_for,
)


BF16_EPS = 2.0**-7  # spacing of bfloat16 numbers in [1, 2)


# ----------------------------------------------------------------------------- stochastic rounding


@pytest.mark.parametrize("value", [1.0 + 0.3 * BF16_EPS, -(3.0 + 1.7 * BF16_EPS * 2), 1e-30 * (1 + 0.55 * BF16_EPS)])
def test_stochastic_rounding_is_unbiased_between_the_two_neighbours(value):
    samples = 400_000
    values = torch.full((samples,), value, dtype=torch.float32)
    rounded = stochastic_round_to_bfloat16(values, torch.Generator().manual_seed(0))
    bits = torch.tensor(value, dtype=torch.float32).view(torch.int32).bitwise_and(-(1 << 16))
    down = bits.view(torch.float32).to(torch.bfloat16)  # the neighbour toward zero
    up = (bits + (1 << 16)).view(torch.float32).to(torch.bfloat16)  # the neighbour away from zero
    assert set(rounded.unique().tolist()) == {down.item(), up.item()}
    share_up = (rounded == up).double().mean().item()
    expected_share = (value - down.item()) / (up.item() - down.item())
    standard_error = math.sqrt(expected_share * (1 - expected_share) / samples)
    assert abs(share_up - expected_share) < 5 * standard_error
    assert abs(rounded.double().mean().item() - value) < 5 * standard_error * abs(up.item() - down.item())


def test_stochastic_rounding_keeps_representable_and_special_values():
    representable = torch.tensor([0.0, -0.0, 1.0, -2.5, 3.0e38, 1e-40, math.inf, -math.inf, math.nan])
    nan_with_payload = torch.tensor([0x7FFFFFFF], dtype=torch.int32).view(torch.float32)  # CUDA's default NaN
    values = torch.cat([representable.to(torch.bfloat16).float(), nan_with_payload]).repeat(1000)
    rounded = stochastic_round_to_bfloat16(values, torch.Generator().manual_seed(0)).float()
    finite = torch.isfinite(values)
    assert torch.equal(rounded[finite], values[finite])
    assert torch.equal(torch.isnan(rounded), torch.isnan(values))
    assert torch.equal(rounded[torch.isinf(values)], values[torch.isinf(values)])


def bf16_param(value=1.0, size=20_000):
    return torch.nn.Parameter(torch.full((size,), value, dtype=torch.bfloat16))


def test_rounding_bits_are_fresh_every_step_and_every_parameter():
    first, second = bf16_param(), bf16_param()
    optimizer = StochasticRoundingSGD([first, second], lr=1.0)
    rounded_up = []
    for _ in range(2):
        for param in (first, second):
            param.data.fill_(1.0)
            param.grad = torch.full_like(param, -0.4 * BF16_EPS)
        optimizer.step()
        rounded_up += [first > 1.0, second > 1.0]
    for pattern in rounded_up:
        assert abs(pattern.float().mean().item() - 0.4) < 0.02
    for i in range(len(rounded_up)):
        for j in range(i):
            assert not torch.equal(rounded_up[i], rounded_up[j])


def test_small_updates_accumulate_in_expectation_only_with_stochastic_rounding():
    results = {}
    for stochastic in (True, False):
        param = bf16_param(size=5000)
        optimizer = StochasticRoundingSGD([param], lr=1.0, stochastic_rounding=stochastic)
        for _ in range(100):
            param.grad = torch.full_like(param, -0.1 * BF16_EPS)
            optimizer.step()
        results[stochastic] = param.double().mean().item()
    assert results[False] == 1.0  # round-to-nearest loses every update
    assert abs(results[True] - (1.0 + 10 * BF16_EPS)) < 0.3 * BF16_EPS


# ----------------------------------------------------------------------------- SGD semantics


def random_grads(shape, steps, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _ in range(steps)]


@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_float32_matches_torch_sgd_exactly(momentum, nesterov):
    start = torch.randn(7, 5)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours_optimizer = StochasticRoundingSGD([ours], lr=0.05, momentum=momentum, nesterov=nesterov)
    torch_optimizer = torch.optim.SGD([theirs], lr=0.05, momentum=momentum, nesterov=nesterov)
    for grad in random_grads((7, 5), 6):
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        ours_optimizer.step()
        torch_optimizer.step()
        assert torch.equal(ours, theirs)
    if momentum:
        assert torch.equal(
            ours_optimizer.state[ours]["momentum_buffer"], torch_optimizer.state[theirs]["momentum_buffer"]
        )


@pytest.mark.parametrize("nesterov", [False, True])
def test_weight_decay_is_decoupled(nesterov):
    lr, momentum, weight_decay = 0.05, 0.9, 0.01
    param = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = StochasticRoundingSGD([param], lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    expected, buffer = param.detach().double().clone(), None
    for grad in random_grads((4, 3), 5, seed=1):
        param.grad = grad.clone()
        optimizer.step()
        grad = grad.double()
        buffer = grad.clone() if buffer is None else momentum * buffer + grad
        direction = grad + momentum * buffer if nesterov else buffer
        expected = expected * (1 - lr * weight_decay) - lr * direction
    torch.testing.assert_close(param.detach().double(), expected, rtol=1e-5, atol=1e-6)


def test_no_momentum_buffer_without_momentum_and_float32_buffer_by_default():
    no_momentum, with_momentum, param_dtype = bf16_param(size=8), bf16_param(size=8), bf16_param(size=8)
    optimizers = [
        StochasticRoundingSGD([no_momentum], momentum=0.0),
        StochasticRoundingSGD([with_momentum], momentum=0.9),
        StochasticRoundingSGD([param_dtype], momentum=0.9, momentum_dtype=None),
    ]
    for param, optimizer in zip((no_momentum, with_momentum, param_dtype), optimizers):
        param.grad = torch.ones_like(param)
        optimizer.step()
    assert "momentum_buffer" not in optimizers[0].state[no_momentum]
    assert optimizers[1].state[with_momentum]["momentum_buffer"].dtype == torch.float32
    assert optimizers[2].state[param_dtype]["momentum_buffer"].dtype == torch.bfloat16


def test_chunked_update_matches_a_single_chunk(monkeypatch):
    import haste_hf.training.optimization as optimization

    start = torch.randn(37, 3, 5).to(torch.bfloat16)
    results = []
    for chunk in (1 << 24, 16):  # one chunk vs 1 row (15 elements) per chunk
        monkeypatch.setattr(optimization, "_CHUNK_ELEMENTS", chunk)
        param = torch.nn.Parameter(start.clone())
        optimizer = StochasticRoundingSGD([param], lr=0.1, momentum=0.9, weight_decay=0.1)
        for grad in random_grads((37, 3, 5), 3):
            param.grad = grad.to(torch.bfloat16)
            optimizer.step()
        results.append((param.detach().clone(), optimizer.state[param]["momentum_buffer"].clone()))
    assert torch.equal(results[0][1], results[1][1])
    # Rounding noise is drawn chunk by chunk from one stream, so weights agree in distribution, not bits.
    torch.testing.assert_close(results[0][0].float(), results[1][0].float(), atol=2 * BF16_EPS * 4, rtol=0)


def saved_and_loaded(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("momentum_dtype", [torch.float32, None])
def test_state_dict_round_trip_continues_bit_identically(momentum_dtype):
    grads = [g.to(torch.bfloat16) for g in random_grads((64, 8), 8, seed=2)]

    def make(params):
        return StochasticRoundingSGD(
            params, lr=0.3, momentum=0.9, weight_decay=0.01, momentum_dtype=momentum_dtype, seed=7
        )

    params = [torch.nn.Parameter(torch.randn(64, 8).to(torch.bfloat16)), torch.nn.Parameter(torch.randn(3))]
    optimizer = make(params)

    def run(params, optimizer, grads):
        for grad in grads:
            params[0].grad, params[1].grad = grad, grad[0, :3].float()
            optimizer.step()

    run(params, optimizer, grads[:4])
    checkpoint = saved_and_loaded(optimizer.state_dict())
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    run(params, optimizer, grads[4:])

    resumed = make(resumed_params)
    resumed.load_state_dict(checkpoint)
    assert resumed.state[resumed_params[0]]["momentum_buffer"].dtype == (momentum_dtype or torch.bfloat16)
    run(resumed_params, resumed, grads[4:])
    for original, again in zip(params, resumed_params):
        assert torch.equal(original, again)
    assert torch.equal(
        optimizer.state[params[0]]["momentum_buffer"], resumed.state[resumed_params[0]]["momentum_buffer"]
    )


def test_bfloat16_momentum_buffer_is_rounded_stochastically():
    """`momentum_dtype=None` keeps a bf16 buffer: its running average must not be rounded to nearest."""
    shares = {}
    for stochastic in (True, False):
        param = torch.nn.Parameter(torch.zeros(100_000, dtype=torch.bfloat16))
        optimizer = StochasticRoundingSGD(
            [param], lr=0.0, momentum=0.5, momentum_dtype=None, stochastic_rounding=stochastic
        )
        for grad in (1.0, 2.0**-10):  # buffer: 1, then 0.5 + 2^-10, a quarter of the bf16 spacing above 0.5
            param.grad = torch.full_like(param, grad)
            optimizer.step()
        buffer = optimizer.state[param]["momentum_buffer"]
        assert buffer.dtype == torch.bfloat16 and set(buffer.unique().tolist()) <= {0.5, 0.5 + 2.0**-8}
        shares[stochastic] = (buffer > 0.5).double().mean().item()
    assert abs(shares[True] - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 100_000) and shares[False] == 0.0


def test_bad_hyperparameters_raise():
    param = [torch.nn.Parameter(torch.ones(2))]
    with pytest.raises(ValueError, match="lr"):
        StochasticRoundingSGD(param, lr=-1.0)
    with pytest.raises(ValueError, match="nesterov"):
        StochasticRoundingSGD(param, nesterov=True)
    with pytest.raises(ValueError, match="momentum_dtype"):
        StochasticRoundingSGD(param, momentum=0.9, momentum_dtype=torch.int8)


# ----------------------------------------------------------------------------- HasteOptimizer, schedules


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = torch.nn.Linear(6, 8)
        self.output = torch.nn.Linear(8, 5)

    def forward(self, x):
        return self.output(torch.tanh(self.encoder(x)))


def make_haste_optimizer(model, momentum=0.9):
    return HasteOptimizer(
        torch.optim.AdamW(model.encoder.parameters(), lr=1e-2, weight_decay=0.01),
        StochasticRoundingSGD(model.output.parameters(), lr=0.1, momentum=momentum, weight_decay=1e-4),
    )


def batches(steps=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 6, generator=generator), torch.randn(4, 5, generator=generator)) for _ in range(steps)]


def test_haste_optimizer_exposes_and_steps_both_children():
    model = TinyModel()
    optimizer = make_haste_optimizer(model)
    children = optimizer.encoder_optimizer, optimizer.output_optimizer
    assert all(
        any(group is child_group for group in optimizer.param_groups)
        for child in children
        for child_group in child.param_groups
    )
    assert len(optimizer.param_groups) == 2

    reference = TinyModel()
    reference_optimizers = make_haste_optimizer(reference).optimizers
    for x, y in batches():
        for net, zero_grads, steps in (
            (model, [optimizer.zero_grad], [optimizer.step]),
            (reference, [o.zero_grad for o in reference_optimizers], [o.step for o in reference_optimizers]),
        ):
            for zero_grad in zero_grads:
                zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            for step in steps:
                step()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)
    assert set(optimizer.state) == set(model.parameters())
    assert "exp_avg" in optimizer.state[model.encoder.weight]
    assert "momentum_buffer" in optimizer.state[model.output.weight]
    assert model.output.weight.grad is not None
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_haste_optimizer_state_dict_round_trip():
    model = TinyModel()
    optimizer = make_haste_optimizer(model)
    for x, y in batches(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    checkpoint = saved_and_loaded(optimizer.state_dict())
    resumed_model = copy.deepcopy(model)
    resumed = make_haste_optimizer(resumed_model)
    resumed.load_state_dict(checkpoint)
    for net, opt in ((model, optimizer), (resumed_model, resumed)):
        for x, y in batches(3, seed=1):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    for ours, theirs in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(ours, theirs)
    with pytest.raises(ValueError, match="'encoder' and 'output'"):
        resumed.load_state_dict(checkpoint["encoder"])


def test_a_checkpoint_of_another_output_group_count_names_the_tail_scale_that_resumes_it():
    """One output group (`output_tail_lr_scale` 1) against two (head and tail apart), both ways: one line naming the
    flag and the `HasteTrainingArguments` field, never torch's bare group mismatch."""
    model = TinyModel()

    def haste_optimizer(groups: int) -> HasteOptimizer:
        weight, bias = model.output.parameters()
        output_groups = [{"params": [weight, bias]}] if groups == 1 else [{"params": [weight]}, {"params": [bias]}]
        return HasteOptimizer(torch.optim.AdamW(model.encoder.parameters()), StochasticRoundingSGD(output_groups))

    one, two = haste_optimizer(1).state_dict(), haste_optimizer(2).state_dict()
    with pytest.raises(ValueError, match=r"1 parameter group\(s\) and this run's 2") as refused:
        haste_optimizer(2).load_state_dict(one)
    assert "--output-tail-lr-scale 1 (`output_tail_lr_scale=1` in HasteTrainingArguments)" in str(refused.value)
    with pytest.raises(ValueError, match=r"2 parameter group\(s\) and this run's 1") as refused:
        haste_optimizer(1).load_state_dict(two)
    assert "--output-tail-lr-scale (`output_tail_lr_scale`) other than 1" in str(refused.value)


def test_haste_optimizer_rejects_shared_parameters_and_new_groups():
    model = TinyModel()
    with pytest.raises(ValueError, match="share parameters"):
        HasteOptimizer(torch.optim.AdamW(model.parameters()), StochasticRoundingSGD(model.output.parameters()))
    with pytest.raises(NotImplementedError):
        make_haste_optimizer(model).add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})


def test_haste_optimizer_and_scheduler_through_accelerate():
    plain_model, accelerated_model = TinyModel(), TinyModel()
    plain = make_haste_optimizer(plain_model)
    plain_scheduler = get_haste_scheduler(plain, 10, encoder_warmup=2, output_warmup=0.3)
    accelerator = Accelerator(cpu=True)
    model, optimizer = accelerator.prepare(accelerated_model, make_haste_optimizer(accelerated_model))
    assert isinstance(optimizer, AcceleratedOptimizer)
    scheduler = get_haste_scheduler(optimizer, 10, encoder_warmup=2, output_warmup=0.3)
    for x, y in batches(6):
        norms = []
        for net, opt, sched, backward, clip in (
            (plain_model, plain, plain_scheduler, torch.Tensor.backward, torch.nn.utils.clip_grad_norm_),
            (model, optimizer, scheduler, lambda loss: accelerator.backward(loss), accelerator.clip_grad_norm_),
        ):
            backward(torch.nn.functional.mse_loss(net(x), y) * 100)
            norms.append(clip(net.parameters(), 0.5))
            opt.step()
            sched.step()
            opt.zero_grad()
        plain_norm, accelerated_norm = norms
        assert torch.allclose(
            accelerated_norm, plain_norm
        )  # accelerate's clipping sees the parameters of both children
        assert scheduler.get_last_lr() == plain_scheduler.get_last_lr()
        assert [g["lr"] for g in optimizer.param_groups] == scheduler.get_last_lr()
    for ours, theirs in zip(plain_model.parameters(), accelerated_model.parameters()):
        assert torch.equal(ours, theirs)
    # the accelerate wrapper saves and restores the nested state
    assert set(optimizer.state_dict()) == {"encoder", "output"}
    optimizer.load_state_dict(saved_and_loaded(optimizer.state_dict()))
    assert "momentum_buffer" in optimizer.state[accelerated_model.output.weight]


def test_scheduler_follows_each_childs_own_warmup_and_decay():
    optimizer = make_haste_optimizer(TinyModel())
    total = 20
    scheduler = get_haste_scheduler(optimizer, total, "linear", 4, "cosine", 0.1)
    assert isinstance(scheduler, HasteScheduler)
    encoder_lr, output_lr = 1e-2, 0.1
    for step in range(total):
        expected_encoder = encoder_lr * (step / 4 if step < 4 else (total - step) / (total - 4))
        progress = (step - 2) / (total - 2)
        expected_output = output_lr * (step / 2 if step < 2 else 0.5 * (1 + math.cos(math.pi * progress)))
        assert scheduler.get_last_lr() == pytest.approx([expected_encoder, expected_output])
        if step == 7:
            checkpoint = saved_and_loaded(scheduler.state_dict())
        optimizer.step()  # no gradients: only tells the schedulers the optimizer stepped
        scheduler.step()
    resumed = get_haste_scheduler(make_haste_optimizer(TinyModel()), total, "linear", 4, "cosine", 0.1)
    resumed.load_state_dict(checkpoint)
    expected_encoder = encoder_lr * (total - 7) / (total - 4)
    assert resumed.get_last_lr()[0] == pytest.approx(expected_encoder)


def test_warmup_steps_follow_transformers_convention():
    assert warmup_steps_for(0, 100) == 0
    assert warmup_steps_for(5, 100) == 5
    assert warmup_steps_for(0.1, 1000) == 100
    assert warmup_steps_for(0.05, 30) == 2
    with pytest.raises(ValueError, match="Warm-up"):
        warmup_steps_for(-1, 10)
    with pytest.raises(TypeError, match="HasteOptimizer"):
        get_haste_scheduler(torch.optim.SGD(TinyModel().parameters(), lr=0.1), 10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_stochastic_rounding_sgd():
    # unbiased rounding, NaN kept (CUDA's default NaN 0x7FFFFFFF would wrap to -0 without the guard)
    value = 1.0 + 0.3 * BF16_EPS
    rounded = stochastic_round_to_bfloat16(
        torch.full((400_000,), value, device="cuda"), torch.Generator("cuda").manual_seed(0)
    )
    assert abs((rounded > 1.0).double().mean().item() - 0.3) < 5 * math.sqrt(0.21 / 400_000)
    nan = torch.tensor([0x7FFFFFFF], dtype=torch.int32, device="cuda").view(torch.float32).repeat(1000)
    assert bool(torch.isnan(stochastic_round_to_bfloat16(nan, torch.Generator("cuda"))).all())
    # float32 parameters: same as torch's SGD on CUDA (foreach)
    start = torch.randn(33, 17, device="cuda")
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    ours_optimizer = StochasticRoundingSGD([ours], lr=0.05, momentum=0.9, nesterov=True)
    torch_optimizer = torch.optim.SGD([theirs], lr=0.05, momentum=0.9, nesterov=True)
    for grad in random_grads((33, 17), 4):
        ours.grad, theirs.grad = grad.cuda(), grad.cuda()
        ours_optimizer.step()
        torch_optimizer.step()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    # bf16 parameters: small updates accumulate in expectation; a state_dict round trip continues bit for bit
    param = torch.nn.Parameter(torch.ones(5000, device="cuda", dtype=torch.bfloat16))
    optimizer = StochasticRoundingSGD([param], lr=1.0, momentum=0.5)
    for _ in range(50):
        param.grad = torch.full_like(param, -0.05 * BF16_EPS)
        optimizer.step()
    checkpoint, saved = saved_and_loaded(optimizer.state_dict()), param.detach().clone()
    continued = []
    for target, opt in ((param, optimizer), (None, None)):
        if target is None:
            target = torch.nn.Parameter(saved.clone())
            opt = StochasticRoundingSGD([target], lr=1.0, momentum=0.5)
            opt.load_state_dict(checkpoint)
            assert opt.state[target]["momentum_buffer"].dtype == torch.float32
        for _ in range(5):
            target.grad = torch.full_like(target, -0.05 * BF16_EPS)
            opt.step()
        continued.append(target.detach().clone())
    assert torch.equal(continued[0], continued[1])
    expected = 1.0 + 0.05 * BF16_EPS * sum(sum(0.5**i for i in range(n)) for n in range(1, 56))
    assert abs(continued[0].double().mean().item() - expected) < 0.2 * BF16_EPS


def within_one_bfloat16_step(values, reference):
    """Whether each bf16 value is one of the two bf16 neighbours of the float32 `reference`."""
    spacing = torch.ldexp(torch.ones_like(reference), torch.frexp(reference).exponent - 8)
    return bool(((values.float() - reference).abs() <= spacing).all())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "momentum,momentum_dtype,nesterov,weight_decay",
    [
        (0.0, torch.float32, False, 0.0),
        (0.9, torch.float32, False, 0.01),
        (0.9, None, False, 0.0),
        (0.9, torch.float32, True, 0.01),
    ],
)
def test_cuda_fused_update_matches_the_pytorch_update(momentum, momentum_dtype, nesterov, weight_decay):
    pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(0)
    shape = (301, 7, 5)  # not a multiple of the kernel's block
    start = torch.randn(shape, generator=generator).to(torch.bfloat16).cuda()
    grads = [torch.randn(shape, generator=generator).to(torch.bfloat16).cuda() for _ in range(2)]
    hyper = dict(
        lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, momentum_dtype=momentum_dtype
    )
    fused_param, plain_param = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    fused = StochasticRoundingSGD([fused_param], fused=True, **hyper)
    plain = StochasticRoundingSGD([plain_param], fused=False, **hyper)
    for grad in grads:  # first step (buffer created), then a step from equal states
        with torch.no_grad():
            fused_param.copy_(plain_param)
            if "momentum_buffer" in plain.state[plain_param]:
                fused.state[fused_param]["momentum_buffer"] = plain.state[plain_param]["momentum_buffer"].clone()
        before = plain_param.detach().float().clone()
        previous = plain.state[plain_param].get("momentum_buffer")
        previous = None if previous is None else previous.float().clone()
        fused_param.grad, plain_param.grad = grad.clone(), grad.clone()
        fused.step()
        plain.step()
        g = grad.float()
        average = g if previous is None else momentum * previous + g
        direction = (g + momentum * average if nesterov else average) if momentum else g
        exact = before * (1 - 0.05 * weight_decay) - 0.05 * direction
        assert within_one_bfloat16_step(fused_param.detach(), exact)
        assert within_one_bfloat16_step(plain_param.detach(), exact)
        if momentum:
            fused_buffer = fused.state[fused_param]["momentum_buffer"]
            if momentum_dtype is None:
                assert within_one_bfloat16_step(fused_buffer, average)
            else:
                torch.testing.assert_close(fused_buffer, average, rtol=1e-6, atol=1e-6)
    # fresh bits: the rounding pattern differs between the two steps of a parameter and between parameters
    twins = [torch.nn.Parameter(torch.ones(50_000, dtype=torch.bfloat16, device="cuda")) for _ in range(2)]
    optimizer = StochasticRoundingSGD(twins, lr=1.0, fused=True)
    patterns = []
    for _ in range(2):
        for twin in twins:
            twin.data.fill_(1.0)
            twin.grad = torch.full_like(twin, -0.5 * BF16_EPS)
        optimizer.step()
        patterns += [twin > 1.0 for twin in twins]
    assert all(abs(p.float().mean().item() - 0.5) < 0.02 for p in patterns)
    assert all(not torch.equal(patterns[i], patterns[j]) for i in range(4) for j in range(i))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fused_update_rounds_a_bfloat16_momentum_buffer_and_the_weights_without_bias():
    pytest.importorskip("triton")
    samples = 200_000
    param = torch.nn.Parameter(torch.zeros(samples, dtype=torch.bfloat16, device="cuda"))
    optimizer = StochasticRoundingSGD([param], lr=2.0**-4, momentum=0.5, momentum_dtype=None, fused=True)
    for grad in (1.0, 2.0**-10):  # buffer: 1, then 0.5 + 2^-10, a quarter of the bf16 spacing above 0.5
        param.grad = torch.full_like(param, grad)
        optimizer.step()
    buffer = optimizer.state[param]["momentum_buffer"]
    assert buffer.dtype == torch.bfloat16 and set(buffer.unique().tolist()) <= {0.5, 0.5 + 2.0**-8}
    tolerance = 5 * math.sqrt(0.25 * 0.75 / samples)
    assert abs((buffer > 0.5).double().mean().item() - 0.25) < tolerance
    # weights: -2^-4 after the first step (exact), then -2^-4 - 2^-4 * (0.5 + 2^-10): an eighth of the bf16
    # spacing (2^-11) beyond -0.09375, so rounded away from zero with probability 1/8 (nearest would never)
    exact = -(2.0**-4) - 2.0**-4 * (0.5 + 2.0**-10)
    assert abs(param.double().mean().item() - exact) < 5 * 2.0**-11 * math.sqrt(0.125 * 0.875 / samples)


def test_fused_true_without_a_fused_path_raises():
    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.ones(4)
    with pytest.raises(RuntimeError, match="fused=True"):
        StochasticRoundingSGD([param], fused=True).step()


def test_a_scalar_is_one_chunk_and_rows_are_cut_into_chunks_of_the_bound(monkeypatch):
    import haste_hf.training.optimization as optimization

    assert list(optimization._row_chunks(torch.tensor(3.0))) == [slice(None)]
    monkeypatch.setattr(optimization, "_CHUNK_ELEMENTS", 30)
    chunks = list(optimization._row_chunks(torch.zeros(7, 3, 5)))  # 2 rows (30 elements) a chunk
    assert [(chunk.start, chunk.stop) for chunk in chunks] == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert list(optimization._row_chunks(torch.zeros(0, 4))) == []  # a rank's share without rows
