# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Cost of the output-layer optimizer step and of one rewiring, at the paper's label counts.

- SGD step on a bf16 tail weight ``[L/G, G, F]`` with momentum 0.9: `StochasticRoundingSGD` (float32
  or bf16 momentum, stochastic rounding; fused Triton kernel on CUDA, and its PyTorch path) against
  `torch.optim.SGD` (foreach, bf16 momentum, round-to-nearest), with the extra peak memory of each step.
- `rewire_` (fraction 0.2, global scope, zero init) on the same tail, and on CUDA whether it agrees with
  the CPU result.

    python benchmarks/optimization.py                 # CUDA when available, else CPU with small sizes
    python benchmarks/optimization.py --labels 670000 2810000 8620000 --fan-in 64
"""

import argparse
import time

import torch

from haste_hf.modeling.rewiring import rewire_
from haste_hf.training.optimization import StochasticRoundingSGD


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    fn()  # warm-up (allocations, lazily created state)
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def extra_peak_mib(fn, device):
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def sgd_case(labels, group_size, fan_in, device, repeats):
    groups = -(-labels // group_size)
    shape = (groups, group_size, fan_in)
    rows = []
    for name, make in (
        (
            "torch.optim.SGD (bf16 momentum, nearest)",
            lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.9, foreach=True),
        ),
        ("StochasticRoundingSGD (fp32 momentum, SR)", lambda p: StochasticRoundingSGD([p], lr=0.05, momentum=0.9)),
        (
            "StochasticRoundingSGD (bf16 momentum, SR)",
            lambda p: StochasticRoundingSGD([p], lr=0.05, momentum=0.9, momentum_dtype=None),
        ),
        (
            "StochasticRoundingSGD (fp32 momentum, SR, PyTorch path)",
            lambda p: StochasticRoundingSGD([p], lr=0.05, momentum=0.9, fused=False),
        ),
        (
            "StochasticRoundingSGD (fp32 momentum, nearest)",
            lambda p: StochasticRoundingSGD([p], lr=0.05, momentum=0.9, stochastic_rounding=False),
        ),
    ):
        param = torch.nn.Parameter(torch.randn(shape, device=device, dtype=torch.bfloat16))
        param.grad = torch.randn_like(param)
        optimizer = make(param)
        optimizer.step()  # allocates the momentum buffer
        milliseconds = timed(optimizer.step, device, repeats)
        rows.append((name, milliseconds, extra_peak_mib(optimizer.step, device)))
        del param, optimizer
    return rows


def rewiring_case(labels, group_size, fan_in, features, device, repeats):
    groups = -(-labels // group_size)
    generator = torch.Generator().manual_seed(0)
    supports = torch.rand(groups, features, generator=generator).argsort(dim=1)[:, :fan_in].int()
    weight = torch.randn(groups, group_size, fan_in, generator=generator).to(torch.bfloat16)
    weight_device, supports_device = weight.to(device), supports.to(device)
    step = iter(range(10**6))
    milliseconds = timed(
        lambda: rewire_(weight_device, supports_device, features, 0.2, step=next(step)), device, repeats
    )
    agrees = None
    if device.type == "cuda":
        cpu_weight, cpu_supports = weight.clone(), supports.clone()
        gpu_weight, gpu_supports = weight.to(device), supports.to(device)
        rewire_(cpu_weight, cpu_supports, features, 0.2, init="random", seed=1, step=1)
        rewire_(gpu_weight, gpu_supports, features, 0.2, init="random", seed=1, step=1)
        agrees = torch.equal(cpu_supports, gpu_supports.cpu()) and torch.equal(cpu_weight, gpu_weight.cpu())
    return milliseconds, agrees


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=int, nargs="+", default=None)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--fan-in", type=int, default=64)
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    labels = args.labels or ([670_000, 2_810_000, 8_620_000] if device.type == "cuda" else [100_000])
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}")
    print(f"G={args.group_size} F={args.fan_in} d={args.features}; median ms over {args.repeats} runs\n")
    print("| L | optimizer step | ms | x torch SGD | extra peak MiB |")
    print("|---|---|---|---|---|")
    for count in labels:
        rows = sgd_case(count, args.group_size, args.fan_in, device, args.repeats)
        baseline = rows[0][1]
        for name, milliseconds, peak in rows:
            print(f"| {count / 1e6:.2f}M | {name} | {milliseconds:.2f} | {milliseconds / baseline:.2f} | {peak:.0f} |")
    print("\n| L | groups | rewire_ ms (fraction 0.2, global, zero init) | CUDA == CPU (random init) |")
    print("|---|---|---|---|")
    for count in labels:
        milliseconds, agrees = rewiring_case(
            count, args.group_size, args.fan_in, args.features, device, min(args.repeats, 3)
        )
        print(f"| {count / 1e6:.2f}M | {-(-count // args.group_size)} | {milliseconds:.1f} | {agrees} |")


if __name__ == "__main__":
    main()
