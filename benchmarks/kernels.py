# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Times the group-sparse tail kernels against cuBLAS baselines, pass by pass.

Per shape (B, L = K * G, F, G; d = 768) and pass (fwd, bwd_w, bwd_x) it prints, in milliseconds
(medians over CUDA-event-timed runs after warm-up, inputs rotated between runs):
  ours       the haste_hf kernels (bwd_x: fast mode; `ours_det`: the deterministic mode)
  flops      FLOPs-matched dense: X[B, F] x W[L, F]^T and its two gradients (cuBLAS)
  dense      the full dense layer X[B, d] x W[L, d]^T and its two gradients (cuBLAS)
  torch      the PyTorch path of haste_hf.modeling.sparse_ops (only with --torch-path, slow); its backward
             computes both gradients at once, so its bwd_w and bwd_x both time the whole backward
  ratio      ours / flops
and the peak memory of one forward + backward through the kernels beyond the inputs.

    python benchmarks/kernels.py                      # the issue's grid, bf16
    python benchmarks/kernels.py --batch 64 --labels 0.67 --fan-in 64 --group 32 --torch-path
"""

import argparse
import itertools
import statistics
import sys

import torch

from haste_hf.kernels import ops as kernels
from haste_hf.modeling import sparse_ops


PASSES = ("fwd", "bwd_w", "bwd_x")


def median_ms(fn, inputs, warmup=3, repeats=15):
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    times = []
    for i in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        args = inputs[i % len(inputs)]
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rotations(nbytes):
    """Copies of the inputs to rotate through: enough that they do not all sit in the L2 cache."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(4, (4 * l2) // max(1, nbytes) + 1))


def bench_shape(batch, num_labels, fan_in, group_size, features, dtype, torch_path, dense_cache, passes=PASSES):
    groups = num_labels // group_size
    labels = groups * group_size
    device = "cuda"
    n_rot = rotations(labels * fan_in * 2 + batch * labels * 2)
    operands = []
    for _ in range(n_rot):
        x = torch.randn(batch, features, device=device, dtype=dtype)
        weight = torch.randn(groups, group_size, fan_in, device=device, dtype=dtype) / fan_in**0.5
        supports = torch.rand(groups, features, device=device).argsort(dim=1)[:, :fan_in].int().contiguous()
        grad_out = torch.randn(batch, labels, device=device, dtype=dtype)
        operands.append((x, weight, supports, grad_out))
    ops = torch.ops.haste
    # FLOPs-matched dense: same FLOPs and weight bytes, no gather.
    flat = [(x[:, :fan_in].contiguous(), w.view(labels, fan_in), g) for x, w, _, g in operands]
    timed = {
        ("fwd", "ours"): (lambda x, w, s, g: ops.group_sparse_forward(x, w, s, None, False), operands),
        ("bwd_w", "ours"): (lambda x, w, s, g: ops.group_sparse_grad_weight(g, x, s, group_size), operands),
        ("bwd_x", "ours"): (lambda x, w, s, g: ops.group_sparse_grad_input(g, w, s, features, False), operands),
        ("bwd_x", "ours_det"): (lambda x, w, s, g: ops.group_sparse_grad_input(g, w, s, features, True), operands),
        ("fwd", "flops"): (lambda xf, wf, g: torch.mm(xf, wf.t()), flat),
        ("bwd_w", "flops"): (lambda xf, wf, g: torch.mm(g.t(), xf), flat),
        ("bwd_x", "flops"): (lambda xf, wf, g: torch.mm(g, wf), flat),
    }
    row = {key: median_ms(fn, args) for key, (fn, args) in timed.items() if key[0] in passes}

    key = (batch, labels)
    if key not in dense_cache:
        # Full dense layer; the weight is [L, d], so one copy only (it dwarfs the L2 cache).
        xd, gd = operands[0][0], operands[0][3]
        wd = torch.randn(labels, features, device=device, dtype=dtype)
        dense = {
            "fwd": lambda: torch.mm(xd, wd.t()),
            "bwd_w": lambda: torch.mm(gd.t(), xd),
            "bwd_x": lambda: torch.mm(gd, wd),
        }
        dense_cache[key] = {p: median_ms(dense[p], [()]) for p in passes}
        del wd
    for p in passes:
        row[p, "dense"] = dense_cache[key][p]

    if torch_path:
        fn = sparse_ops._GroupSparseLinearFunction
        x, w, s, g = operands[0]
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        row["fwd", "torch"] = median_ms(lambda: sparse_ops._forward_reference(x, w, s), [()], warmup=1, repeats=3)
        out = fn.apply(xr, wr, s)
        row["bwd_w", "torch"] = median_ms(lambda: torch.autograd.grad(out, wr, g, retain_graph=True), [()], 1, 3)
        row["bwd_x", "torch"] = median_ms(lambda: torch.autograd.grad(out, xr, g, retain_graph=True), [()], 1, 3)
        del out

    # Peak memory of forward + backward through the kernels, beyond the live inputs.
    x, w, s, g = operands[0]
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    kernels.group_sparse_linear(xr, wr, s).backward(g)
    torch.cuda.synchronize()
    row["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    paths = kernels.kernel_paths(x, w)
    row["path"] = "".join(paths[p][0] for p in ("forward", "grad_weight", "grad_input"))
    return labels, row


def cell(row, key):
    """A timing of the table, or '-' where it was not measured."""
    return f"{row[key]:8.3f}" if key in row else f"{'-':>8}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--labels", type=float, nargs="+", default=[0.67, 2.8, 8.6], help="millions")
    parser.add_argument("--fan-in", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--group", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES, help="passes to time")
    parser.add_argument("--torch-path", action="store_true", help="also time the PyTorch path (slow)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if not kernels.is_available():
        sys.exit("the CUDA kernels are not available on this machine")
    name = torch.cuda.get_device_name()
    header = (
        f"{'B':>4} {'L':>8} {'F':>4} {'G':>3} {'pass':<6} {'ours':>8} {'ours_det':>8} {'flops':>8} {'dense':>8} "
        f"{'torch':>8} {'ratio':>6} {'peakGiB':>7} path"
    )
    lines = [f"# {name}, torch {torch.__version__}, {args.dtype}, d = {args.features}, ms (median)", header]
    print(lines[0], flush=True)
    print(header, flush=True)
    ratios = {}
    dense_cache = {}
    for batch, millions in itertools.product(args.batch, args.labels):
        for fan_in, group_size in itertools.product(args.fan_in, args.group):
            labels, row = bench_shape(
                batch,
                int(millions * 1e6),
                fan_in,
                group_size,
                args.features,
                dtype,
                args.torch_path,
                dense_cache,
                args.passes,
            )
            for p in args.passes:
                ratio = row[p, "ours"] / row[p, "flops"]
                ratios[batch, labels, fan_in, group_size, p] = ratio
                line = (
                    f"{batch:>4} {labels / 1e6:7.2f}M {fan_in:>4} {group_size:>3} {p:<6} {cell(row, (p, 'ours'))} "
                    f"{cell(row, (p, 'ours_det'))} {cell(row, (p, 'flops'))} {cell(row, (p, 'dense'))} "
                    f"{cell(row, (p, 'torch'))} "
                    f"{ratio:6.2f} {row['peak_gib']:7.2f} {row['path']}"
                )
                lines.append(line)
                print(line, flush=True)
        dense_cache.clear()
        torch.cuda.empty_cache()
    met = sum(r <= 1.15 for r in ratios.values())
    summary = [f"# {met}/{len(ratios)} (shape, pass) points at <= 1.15x flops-matched dense"]
    for p in args.passes:
        values = [r for k, r in ratios.items() if k[-1] == p]
        worst = max((r, k) for k, r in ratios.items() if k[-1] == p)
        summary.append(
            f"# {p}: median ratio {statistics.median(values):.2f}, max {worst[0]:.2f} at B={worst[1][0]} "
            f"L={worst[1][1]} F={worst[1][2]} G={worst[1][3]}, met {sum(v <= 1.15 for v in values)}/{len(values)}"
        )
    print("\n".join(summary))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines + summary) + "\n")


if __name__ == "__main__":
    main()
