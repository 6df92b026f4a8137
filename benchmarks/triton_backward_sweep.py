# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Sweeps the launch parameters of the Triton tail kernels at given shapes, against the CUDA build in the same run:
how the `launch_defaults` of `grad_input.py` and `grad_weight.py` (and the forward's `LaunchConfig` at small
batches) were chosen (issue 38).

Per shape (B, L in millions, F, G; d = 768, bf16) it times the CUDA kernels (`haste::` ops) of the weight gradient
(bwd_w), the feature gradient (bwd_x, fast mode; bwd_x_det, deterministic) and the forward (fwd), then the Triton
kernels under each configuration of the pass, and prints each time and its ratio to CUDA; `best` lines at the end.
Stops timing new configurations after `--seconds` (compilations count). A shape may name its passes
(`64,8.6,32,16:bwd_x+bwd_w`). `--compile-only --part i --parts n` runs every n-th configuration once from the i-th
and times nothing: n such processes side by side fill Triton's cache before the timing run.

    python benchmarks/triton_backward_sweep.py --shapes 64,8.6,32,16 512,8.6,128,16:bwd_x
"""

import argparse
import time

import torch
from kernels import median_ms, report
from triton_forward_sweep import Override, parse_shape

from haste_hf.kernels import ops
from haste_hf.kernels.triton.forward import forward
from haste_hf.kernels.triton.grad_input import grad_input
from haste_hf.kernels.triton.grad_weight import grad_weight


# (block_b, programs_per_sm, pack, num_warps, num_stages); the first of each list: the default before the sweep
FAST = [(32, 4, 1, 4, 3), (32, 4, 2, 4, 3), (32, 8, 1, 4, 3), (32, 8, 2, 4, 3), (64, 4, 1, 4, 3), (64, 4, 2, 4, 3)]
FAST += [(32, 4, 1, 2, 3), (32, 4, 2, 2, 3)]
# (block_b, programs_per_sm, num_warps)
DETERMINISTIC = [(32, 4, 4), (32, 2, 4), (32, 1, 4), (16, 2, 4)]
# (block_b, pack, programs_per_sm, num_warps, num_stages)
WEIGHT = [(64, 1, 16, 4, 3), (64, 2, 16, 4, 3), (64, 1, 8, 4, 3), (64, 1, 32, 4, 3), (64, 1, 16, 8, 3)]
WEIGHT += [(32, 1, 16, 4, 3), (64, 2, 16, 8, 3)]
# LaunchConfig attributes
FORWARD = [
    {"block_b": 64, "programs_per_processor": 8, "num_warps": 4, "num_stages": 3},
    {"block_b": 64, "programs_per_processor": 4, "num_warps": 4, "num_stages": 3},
    {"block_b": 64, "programs_per_processor": 16, "num_warps": 4, "num_stages": 3},
    {"block_b": 64, "programs_per_processor": 8, "num_warps": 8, "num_stages": 3},
    {"block_b": 32, "programs_per_processor": 8, "num_warps": 4, "num_stages": 3},
    {"block_b": 64, "programs_per_processor": 8, "num_warps": 4, "num_stages": 2},
]


def parse_sweep_shape(text):
    shape, _, passes = text.partition(":")
    return parse_shape(shape), passes.split("+") if passes else None


def relative_difference(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)).item()


def operands_of(batch, millions, fan_in, group, features):
    groups = int(millions * 1e6) // group
    x = torch.randn(batch, features, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(groups, group, fan_in, device="cuda", dtype=torch.bfloat16) / fan_in**0.5
    # F distinct features a group (topk of random keys: no [K, d] int64 argsort, which side-by-side compile
    # processes could not all hold at 8.6M labels)
    supports = torch.rand(groups, features, device="cuda").topk(fan_in, dim=1).indices.int().contiguous()
    grad_out = torch.randn(batch, groups * group, device="cuda", dtype=torch.bfloat16)
    return [(x, weight, supports, grad_out)]


def triton_calls(group, fan_in, features):
    """(pass, config, fn) of every configuration of the sweep at this shape."""
    calls = []
    for block_b, per_sm, pack, warps, stages in FAST:
        config = dict(block_b=block_b, programs_per_sm=per_sm, pack=pack, num_warps=warps, num_stages=stages)
        calls.append(("bwd_x", config, lambda x, w, s, g, c=config: grad_input(g, w, s, features, False, **c)))
    for block_b, per_sm, warps in DETERMINISTIC:
        config = dict(block_b=block_b, programs_per_sm=per_sm, num_warps=warps)
        calls.append(("bwd_x_det", config, lambda x, w, s, g, c=config: grad_input(g, w, s, features, True, **c)))
    for block_b, pack, per_sm, warps, stages in WEIGHT:
        if pack > 1 and fan_in > min(fan_in, 4096 // max(16, group)):
            continue
        config = dict(block_b=block_b, pack=pack, programs_per_sm=per_sm, num_warps=warps, num_stages=stages)
        calls.append(("bwd_w", config, lambda x, w, s, g, c=config: grad_weight(g, x, s, group, **c)))
    for config in FORWARD:

        def call(x, w, s, g, c=config):
            with Override(**c):
                return forward(x, w, s)

        calls.append(("fwd", config, call))
    return calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", type=parse_sweep_shape, nargs="+", required=True, help="B,L in millions,F,G[:passes]"
    )
    parser.add_argument("--passes", nargs="+", default=["bwd_x", "bwd_x_det", "bwd_w", "fwd"])
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--part", type=int, default=0)
    parser.add_argument("--parts", type=int, default=1)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    if args.compile_only:
        ops.set_backend("triton")
        index = 0
        for (batch, millions, fan_in, group), passes in args.shapes:
            operands = operands_of(batch, millions, fan_in, group, args.features)
            for name, _, fn in triton_calls(group, fan_in, args.features):
                if name in (passes or args.passes):
                    if index % args.parts == args.part and time.monotonic() < deadline:
                        fn(*operands[0])
                    index += 1
            torch.cuda.synchronize()
            del operands
            torch.cuda.empty_cache()
        return
    if not ops.is_available():
        raise SystemExit("the CUDA kernels are not available here: nothing to compare with")
    lines = []
    report(lines, f"# {torch.cuda.get_device_name()}, bf16, d = {args.features}: ms (median), triton / cuda")
    haste = torch.ops.haste
    best = []
    for (batch, millions, fan_in, group), shape_passes in args.shapes:
        if time.monotonic() > deadline:
            break
        passes = shape_passes or args.passes
        operands = operands_of(batch, millions, fan_in, group, args.features)
        shape = f"B={batch} L={millions}M F={fan_in} G={group}"
        cuda = {
            "bwd_x": lambda x, w, s, g: haste.group_sparse_grad_input(g, w, s, args.features, False),
            "bwd_x_det": lambda x, w, s, g: haste.group_sparse_grad_input(g, w, s, args.features, True),
            "bwd_w": lambda x, w, s, g, group=group: haste.group_sparse_grad_weight(g, x, s, group),
            "fwd": lambda x, w, s, g: haste.group_sparse_forward(x, w, s, None, False),
        }
        ops.set_backend("cuda")
        cuda_ms = {name: median_ms(cuda[name], operands) for name in passes}
        cuda_out = {name: cuda[name](*operands[0]) for name in passes}
        ops.set_backend("triton")
        report(lines, f"## {shape}: cuda " + " ".join(f"{n} {t:.3f}" for n, t in cuda_ms.items()))
        results = {}
        for name, config, fn in triton_calls(group, fan_in, args.features):
            if name not in passes or time.monotonic() > deadline:
                continue
            diff = relative_difference(fn(*operands[0]), cuda_out[name])
            ms = median_ms(fn, operands)
            results.setdefault(name, []).append((ms, config))
            report(lines, f"  {name:<9} {config} {ms:.3f} ({ms / cuda_ms[name]:.2f}) diff {diff:.1e}")
        for name, rows in results.items():
            ms, config = min(rows, key=lambda row: row[0])
            first = rows[0][0]
            best.append(
                f"# best {shape} {name}: {config} {ms:.3f} ms ({ms / cuda_ms[name]:.2f}; first config "
                f"{first / cuda_ms[name]:.2f})"
            )
        del operands, cuda_out
        torch.cuda.empty_cache()
    for line in best:
        report(lines, line)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
