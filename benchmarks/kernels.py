# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Times the group-sparse tail kernels against cuBLAS baselines, pass by pass, on one or two backends side by side.

Per shape (B, L = K * G, F, G; d = 768) and pass (fwd, bwd_w, bwd_x; loss: the fused BCE storing its logit
gradient; topk: the fused top-5) it prints, in milliseconds (medians over CUDA-event-timed runs after warm-up,
inputs rotated between runs):
  ours       the haste_hf kernels of the first backend of `--backends` (bwd_x: fast mode; `ours_det`: the
             deterministic mode)
  flops      FLOPs-matched dense: X[B, F] x W[L, F]^T and its two gradients (cuBLAS)
  dense      the full dense layer X[B, d] x W[L, d]^T and its two gradients (cuBLAS)
  torch      the PyTorch path of haste_hf.modeling.sparse_ops (only with --torch-path, slow); its backward
             computes both gradients at once, so its bwd_w and bwd_x both time the whole backward
  ratio      ours / flops
and the peak memory of one forward + backward through the kernels beyond the inputs; with a second backend,
its times (`other`, `other_det`) and `vs`, ours / other (`vs_det` for the deterministic feature gradient), with
each pass's median and worst `vs` at the end.

    python benchmarks/kernels.py                      # the issue's grid, bf16, Triton against the CUDA build
    python benchmarks/kernels.py --backends cuda      # one backend
    python benchmarks/kernels.py --batch 64 --labels 0.67 --fan-in 64 --group 32 --torch-path
"""

import argparse
import itertools
import statistics
import sys

import torch

from haste_hf.kernels import ops as kernels
from haste_hf.modeling import sparse_ops


PASSES = ("fwd", "bwd_w", "bwd_x", "loss", "topk")


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


def sweep_operands(batch, millions, fan_in, group, features, device="cuda"):
    """`(labels, [(x, weight, supports, positions)])`: the bf16 tail operands of one shape of the launch sweeps
    (`triton_forward_sweep.py`, `triton_loss_sweep.py`): B texts of `features` features, L = `millions` million
    labels rounded down to whole groups of G, F distinct features a group, 8 positive positions a text."""
    groups = int(millions * 1e6) // group
    labels = groups * group
    x = torch.randn(batch, features, device=device, dtype=torch.bfloat16)
    weight = torch.randn(groups, group, fan_in, device=device, dtype=torch.bfloat16) / fan_in**0.5
    supports = torch.rand(groups, features, device=device).argsort(dim=1)[:, :fan_in].int().contiguous()
    positions = torch.randint(0, labels, (batch, 8), device=device)
    return labels, [(x, weight, supports, positions)]


def report(lines, line):
    """Prints `line` as it comes and keeps it in `lines` for the `--out` file."""
    lines.append(line)
    print(line, flush=True)


def rotations(nbytes):
    """Copies of the inputs to rotate through: enough that they do not all sit in the L2 cache."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(4, (4 * l2) // max(1, nbytes) + 1))


def bench_shape(batch, num_labels, fan_in, group_size, features, dtype, torch_path, dense_cache, passes, backends):
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
        positions = torch.randint(0, labels, (batch, 8), device=device)
        operands.append((x, weight, supports, grad_out, positions))
    ops = torch.ops.haste
    ours = {
        ("fwd", ""): lambda x, w, s, g, p: ops.group_sparse_forward(x, w, s, None, False),
        ("bwd_w", ""): lambda x, w, s, g, p: ops.group_sparse_grad_weight(g, x, s, group_size),
        ("bwd_x", ""): lambda x, w, s, g, p: ops.group_sparse_grad_input(g, w, s, features, False),
        ("bwd_x", "_det"): lambda x, w, s, g, p: ops.group_sparse_grad_input(g, w, s, features, True),
        ("loss", ""): lambda x, w, s, g, p: ops.linear_loss(x, w, None, s, p, labels, 1 / batch, "bce", True, False),
        ("topk", ""): lambda x, w, s, g, p: ops.group_sparse_topk(x, w, s, None, 5, labels),
    }
    row = {}
    for slot, name in zip(("ours", "other"), backends):
        kernels.set_backend(name)
        for (p, mode), fn in ours.items():
            if p in passes:
                row[p, slot + mode] = median_ms(fn, operands)
    kernels.set_backend(backends[0])
    # FLOPs-matched dense: same FLOPs and weight bytes, no gather (the loss and top-k: the forward's GEMM).
    flat = [(x[:, :fan_in].contiguous(), w.view(labels, fan_in), g) for x, w, _, g, _ in operands]
    baselines = {
        "fwd": lambda xf, wf, g: torch.mm(xf, wf.t()),
        "bwd_w": lambda xf, wf, g: torch.mm(g.t(), xf),
        "bwd_x": lambda xf, wf, g: torch.mm(g, wf),
    }
    for p in passes:
        row[p, "flops"] = median_ms(baselines.get(p, baselines["fwd"]), flat)

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
        dense_cache[key] = {p: median_ms(dense.get(p, dense["fwd"]), [()]) for p in passes}
        del wd
    for p in passes:
        row[p, "dense"] = dense_cache[key][p]

    if torch_path:
        fn = sparse_ops._GroupSparseLinearFunction
        x, w, s, g, _ = operands[0]
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        row["fwd", "torch"] = median_ms(lambda: sparse_ops._forward_reference(x, w, s), [()], warmup=1, repeats=3)
        out = fn.apply(xr, wr, s)
        row["bwd_w", "torch"] = median_ms(lambda: torch.autograd.grad(out, wr, g, retain_graph=True), [()], 1, 3)
        row["bwd_x", "torch"] = median_ms(lambda: torch.autograd.grad(out, xr, g, retain_graph=True), [()], 1, 3)
        del out

    # Peak memory of forward + backward through the first backend's kernels, beyond the live inputs.
    x, w, s, g, _ = operands[0]
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


def summary_lines(ratios, passes, label, target):
    """Per pass: the median and the worst of `ratios` {(B, L, F, G, pass): ratio}, and how many points meet `target`."""
    lines = []
    for p in passes:
        values = [r for k, r in ratios.items() if k[-1] == p]
        if not values:
            continue
        worst = max((r, k) for k, r in ratios.items() if k[-1] == p)
        lines.append(
            f"# {p}: {label} median {statistics.median(values):.2f}, max {worst[0]:.2f} at B={worst[1][0]} "
            f"L={worst[1][1]} F={worst[1][2]} G={worst[1][3]}, <= {target}: {sum(v <= target for v in values)}/"
            f"{len(values)}"
        )
    return lines


def summarize(path):
    """The summary of the two backends' `vs` columns of a table this script printed, whole or cut short."""
    versus = {}
    with open(path) as handle:
        for line in handle:
            fields = line.split()
            if len(fields) < 16 or not fields[0].isdigit():
                continue
            point = (int(fields[0]), fields[1], int(fields[2]), int(fields[3]))
            versus[(*point, fields[4])] = float(fields[15])
            if len(fields) > 16:
                versus[(*point, "bwd_x_det")] = float(fields[16])
    return summary_lines(versus, [*PASSES, "bwd_x_det"], "triton / cuda", 1.3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("--labels", type=float, nargs="+", default=[0.67, 2.8, 8.6], help="millions")
    parser.add_argument("--fan-in", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--group", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--passes", nargs="+", default=list(PASSES), choices=PASSES, help="passes to time")
    parser.add_argument(
        "--backends", nargs="+", default=["triton", "cuda"], choices=kernels.BACKENDS, help="one, or two side by side"
    )
    parser.add_argument("--torch-path", action="store_true", help="also time the PyTorch path (slow)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--summarize", default=None, help="only print the summary of a table (also one cut short)")
    args = parser.parse_args(argv)
    if args.summarize:
        print("\n".join(summarize(args.summarize)))
        return
    dtype = getattr(torch, args.dtype)
    for backend in args.backends:
        kernels.set_backend(backend)
        if not kernels.is_available():
            sys.exit(f"the {backend} kernels are not available on this machine")
    kernels.set_backend(args.backends[0])
    name = torch.cuda.get_device_name()
    header = (
        f"{'B':>4} {'L':>8} {'F':>4} {'G':>3} {'pass':<6} {'ours':>8} {'ours_det':>8} {'flops':>8} {'dense':>8} "
        f"{'torch':>8} {'ratio':>6} {'peakGiB':>7} path"
    )
    if len(args.backends) == 2:
        header += f" {'other':>8} {'other_det':>9} {'vs':>5} {'vs_det':>6}"
    lines = [
        f"# {name}, torch {torch.__version__}, {args.dtype}, d = {args.features}, ms (median); ours = "
        f"{args.backends[0]}" + (f", other = {args.backends[1]}" if len(args.backends) == 2 else ""),
        header,
    ]
    print(lines[0], flush=True)
    print(header, flush=True)
    ratios, versus = {}, {}
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
                args.backends,
            )
            for p in args.passes:
                point = (batch, labels, fan_in, group_size, p)
                ratio = row[p, "ours"] / row[p, "flops"]
                ratios[point] = ratio
                line = (
                    f"{batch:>4} {labels / 1e6:7.2f}M {fan_in:>4} {group_size:>3} {p:<6} {cell(row, (p, 'ours'))} "
                    f"{cell(row, (p, 'ours_det'))} {cell(row, (p, 'flops'))} {cell(row, (p, 'dense'))} "
                    f"{cell(row, (p, 'torch'))} "
                    f"{ratio:6.2f} {row['peak_gib']:7.2f} {row['path']}"
                )
                if len(args.backends) == 2:
                    versus[point] = row[p, "ours"] / row[p, "other"]
                    line += f" {cell(row, (p, 'other'))} {cell(row, (p, 'other_det')):>9} {versus[point]:5.2f}"
                    if (p, "other_det") in row:
                        versus[(*point[:-1], "bwd_x_det")] = row[p, "ours_det"] / row[p, "other_det"]
                        line += f" {versus[(*point[:-1], 'bwd_x_det')]:6.2f}"
                lines.append(line)
                print(line, flush=True)
        dense_cache.clear()
        torch.cuda.empty_cache()
    met = sum(r <= 1.15 for r in ratios.values())
    summary = [f"# {met}/{len(ratios)} (shape, pass) points at <= 1.15x flops-matched dense"]
    summary += summary_lines(ratios, args.passes, "ours / flops", 1.15)
    if versus:
        summary.append(f"# {args.backends[0]} / {args.backends[1]} (targets: median <= 1.1, no point above 1.3)")
        summary += summary_lines(versus, [*args.passes, "bwd_x_det"], f"{args.backends[0]} / {args.backends[1]}", 1.3)
    print("\n".join(summary))
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines + summary) + "\n")


if __name__ == "__main__":
    main()
