# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Times the Triton backward kernels of the sparse tail against the CUDA ones, side by side in one run (issue 38).

Per shape (B, L = K * G, F, G; d = 768) and pass it prints, in milliseconds (medians over CUDA-event-timed runs
after warm-up, inputs rotated between runs, as benchmarks/kernels.py), the CUDA kernel (`haste::` custom op),
the Triton kernel (`haste_hf.kernels.triton`), their ratio, and the relative difference of the two results:
  bwd_w      weight gradient
  bwd_x      feature gradient, fast mode (atomics in both)
  bwd_x_det  feature gradient, deterministic mode

    python benchmarks/triton_backward.py                          # the issue's grid, bf16
    python benchmarks/triton_backward.py --batch 512 --labels 8.6 --sweep   # + feature-gradient splits
"""

import argparse
import itertools
import statistics
import sys
import threading

import torch
from kernels import median_ms, rotations

from haste_hf.kernels import ops as cuda_kernels
from haste_hf.kernels.triton.grad_input import grad_input
from haste_hf.kernels.triton.grad_weight import grad_weight


PASSES = ("bwd_w", "bwd_x", "bwd_x_det")


def make_operands(batch, groups, group_size, fan_in, features, dtype):
    n_rot = rotations(groups * group_size * fan_in * 2 + batch * groups * group_size * 2)
    operands = []
    for _ in range(n_rot):
        x = torch.randn(batch, features, device="cuda", dtype=dtype)
        weight = torch.randn(groups, group_size, fan_in, device="cuda", dtype=dtype) / fan_in**0.5
        supports = torch.rand(groups, features, device="cuda").argsort(dim=1)[:, :fan_in].int().contiguous()
        grad_out = torch.randn(batch, groups * group_size, device="cuda", dtype=dtype)
        operands.append((x, weight, supports, grad_out))
    return operands


def relative_difference(actual, expected):
    return ((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)).item()


def bench_shape(batch, groups, group_size, fan_in, features, dtype, passes):
    operands = make_operands(batch, groups, group_size, fan_in, features, dtype)
    ops = torch.ops.haste
    pairs = {
        "bwd_w": (
            lambda x, w, s, g: ops.group_sparse_grad_weight(g, x, s, group_size),
            lambda x, w, s, g: grad_weight(g, x, s, group_size),
        ),
        "bwd_x": (
            lambda x, w, s, g: ops.group_sparse_grad_input(g, w, s, features, False),
            lambda x, w, s, g: grad_input(g, w, s, features, False),
        ),
        "bwd_x_det": (
            lambda x, w, s, g: ops.group_sparse_grad_input(g, w, s, features, True),
            lambda x, w, s, g: grad_input(g, w, s, features, True),
        ),
    }
    row = {}
    for name in passes:
        cuda_fn, triton_fn = pairs[name]
        row[name] = (
            median_ms(cuda_fn, operands),
            median_ms(triton_fn, operands),
            relative_difference(triton_fn(*operands[0]), cuda_fn(*operands[0])),
        )
    return row, operands


def compile_triton(batches, fan_in, group_size, features, dtype):
    """Runs the Triton kernels once on small operands of the grid's specialisations (Triton specialises on
    sizes divisible by 16), so that their compilation is not timed."""
    for batch in sorted({64 if b % 16 == 0 else b for b in batches}):
        x, weight, supports, grad_out = make_operands(batch, 64, group_size, fan_in, features, dtype)[0]
        grad_weight(grad_out, x, supports, group_size)
        for deterministic in (False, True):
            grad_input(grad_out, weight, supports, features, deterministic)


def sweep_grad_input(operands, features, block_sizes, programs_per_sm):
    """Feature-gradient splits (block_b, programs per multiprocessor; the fast mode's pipeline depth) and the
    weight gradient's runs of groups: (block_b, programs per SM, mode, ms) rows."""
    processors = torch.cuda.get_device_properties(0).multi_processor_count
    groups = operands[0][1].shape[0]
    batch = operands[0][0].shape[0]
    results = []
    for block_b, per_sm in itertools.product(block_sizes, programs_per_sm):
        tiles = -(-batch // block_b)
        per_program = -(-groups // max(1, per_sm * processors // tiles))
        for deterministic, stages in [(False, 2), (False, 3), (False, 4), (True, 1)]:
            split = dict(deterministic=deterministic, block_b=block_b, groups_per_program=per_program)
            split["num_stages"] = stages
            ms = median_ms(lambda x, w, s, g, split=split: grad_input(g, w, s, features, **split), operands)
            mode = "det" if deterministic else f"fast-stages{stages}"
            results.append((block_b, per_sm, mode, ms))
    group_size = operands[0][3].shape[1] // groups
    for per_program in (1, None):  # the weight gradient: one group a program, or the default runs
        ms = median_ms(lambda x, w, s, g, n=per_program: grad_weight(g, x, s, group_size, n), operands)
        results.append(("-", "-", f"bwd_w groups/program={per_program or 'default'}", ms))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--labels", type=float, nargs="+", default=[0.67, 2.8, 8.6], help="millions")
    parser.add_argument("--fan-in", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--group", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES)
    parser.add_argument("--sweep", action="store_true", help="also time feature-gradient splits per shape")
    parser.add_argument("--sweep-block-b", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--sweep-programs-per-sm", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    # The CUDA build (about a minute) runs beside the first shapes' Triton compilation.
    build = threading.Thread(target=cuda_kernels.is_available)
    build.start()
    for fan_in, group_size in itertools.product(args.fan_in, args.group):
        compile_triton(args.batch, fan_in, group_size, args.features, dtype)
    build.join()
    if not cuda_kernels.is_available():
        sys.exit("the CUDA kernels are not available on this machine: nothing to compare with")
    header = f"{'B':>4} {'L':>8} {'F':>4} {'G':>3} {'pass':<9} {'cuda':>8} {'triton':>8} {'ratio':>6} {'diff':>8}"
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}, d = {args.features}", header]
    print("\n".join(lines), flush=True)
    ratios = {name: [] for name in args.passes}
    sweeps = []
    for batch, millions, fan_in, group_size in itertools.product(args.batch, args.labels, args.fan_in, args.group):
        groups = int(millions * 1e6) // group_size
        row, operands = bench_shape(batch, groups, group_size, fan_in, args.features, dtype, args.passes)
        for name, (cuda_ms, triton_ms, diff) in row.items():
            ratios[name].append((triton_ms / cuda_ms, (batch, groups * group_size, fan_in, group_size)))
            line = (
                f"{batch:>4} {groups * group_size / 1e6:7.2f}M {fan_in:>4} {group_size:>3} {name:<9} "
                f"{cuda_ms:8.3f} {triton_ms:8.3f} {triton_ms / cuda_ms:6.2f} {diff:8.1e}"
            )
            lines.append(line)
            print(line, flush=True)
        if args.sweep:
            for block_b, per_sm, mode, ms in sweep_grad_input(
                operands, args.features, args.sweep_block_b, args.sweep_programs_per_sm
            ):
                sweeps.append(
                    f"# sweep B={batch} L={groups * group_size / 1e6:.2f}M F={fan_in} G={group_size} "
                    f"block_b={block_b} programs/SM={per_sm} {mode}: {ms:.3f} ms"
                )
                print(sweeps[-1], flush=True)
        del operands
        torch.cuda.empty_cache()
    summary = []
    for name, values in ratios.items():
        if values:
            worst = max(values)
            met = sum(ratio <= 1.1 for ratio, _ in values)
            summary.append(
                f"# {name}: median ratio triton/cuda {statistics.median(r for r, _ in values):.2f}, worst "
                f"{worst[0]:.2f} at B={worst[1][0]} L={worst[1][1]} F={worst[1][2]} G={worst[1][3]}, "
                f"<= 1.1 at {met}/{len(values)}, > 1.3 at {sum(r > 1.3 for r, _ in values)}"
            )
    print("\n".join(summary), flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines + sweeps + summary) + "\n")


if __name__ == "__main__":
    main()
