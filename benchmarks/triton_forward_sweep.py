# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Sweeps the launch configuration of the Triton forward family (`haste_hf.kernels.triton.forward.LaunchConfig`)
on a few shapes, against the CUDA build's forward in the same run: how `LaunchConfig`'s choices were made.

Per shape (B, L, F, G; d = 768, bf16) it times the logits forward under each configuration (rows per tile, groups
packed per dot, warps, pipeline stages, programs per multiprocessor), then the fused loss and top-k under the
default and the best forward configuration, and prints each time over the CUDA build's.

    python benchmarks/triton_forward_sweep.py
    python benchmarks/triton_forward_sweep.py --shapes 64,2.8,32,16 512,8.6,64,32
"""

import argparse
import itertools

import torch
from kernels import median_ms, report, sweep_operands

from haste_hf.kernels import ops
from haste_hf.kernels.triton import forward as triton_forward


def parse_shape(text):
    batch, millions, fan_in, group = text.split(",")
    return int(batch), float(millions), int(fan_in), int(group)


class Override:
    """Sets attributes of every `LaunchConfig` made while active (after its own choices)."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        self.original = triton_forward.LaunchConfig.__init__
        values, original = self.values, self.original

        def init(config, *args, **kwargs):
            original(config, *args, **kwargs)
            for name, value in values.items():
                setattr(config, name, value)

        triton_forward.LaunchConfig.__init__ = init

    def __exit__(self, *exc):
        triton_forward.LaunchConfig.__init__ = self.original


def sweep_shape(batch, millions, fan_in, group, features, lines):
    """Times the configurations of one shape, appending the table's lines to `lines`."""
    ops_ = torch.ops.haste
    labels, operands = sweep_operands(batch, millions, fan_in, group, features)
    x, weight, supports, _ = operands[0]
    groups = weight.shape[0]
    calls = {
        "fwd": lambda x, w, s, p: ops_.group_sparse_forward(x, w, s, None, False),
        "loss": lambda x, w, s, p: ops_.linear_loss(x, w, None, s, p, labels, 1 / batch, "bce", True, False),
        "topk": lambda x, w, s, p: ops_.group_sparse_topk(x, w, s, None, 5, labels),
    }
    ops.set_backend("cuda")
    cuda = {name: median_ms(fn, operands) for name, fn in calls.items()}
    ops.set_backend("triton")
    default = triton_forward.LaunchConfig(batch, groups, group, fan_in, torch.bfloat16, x.device)
    packs = [1] + ([2] if group == 16 else []) + ([4] if group == 16 and fan_in <= 32 else [])
    configs = [
        {"block_b": block_b, "pack": pack, "num_warps": 4, "num_stages": 3}
        for block_b, pack in itertools.product((64, 128), packs)
    ]
    head = f"## B={batch} L={labels / 1e6:.2f}M F={fan_in} G={group}: cuda " + " ".join(
        f"{k} {v:.3f}" for k, v in cuda.items()
    )
    report(lines, head)
    results = []

    def time_config(config, names=("fwd",)):
        with Override(**config):
            times = {name: median_ms(calls[name], operands) for name in names}
        line = f"  {config} " + " ".join(f"{n} {t:.3f} ({t / cuda[n]:.2f})" for n, t in times.items())
        report(lines, line)
        return times

    for config in configs:
        results.append((time_config(config)["fwd"], config))
    best = min(results, key=lambda item: item[0])[1]
    for warps, stages in ((8, 3), (4, 2), (4, 4), (8, 4)):
        config = dict(best, num_warps=warps, num_stages=stages)
        results.append((time_config(config)["fwd"], config))
    for ppp in (4, 16):
        config = dict(min(results, key=lambda item: item[0])[1], programs_per_processor=ppp)
        results.append((time_config(config)["fwd"], config))
    best = min(results, key=lambda item: item[0])[1]
    chosen = {
        "block_b": default.block_b,
        "pack": default.pack,
        "num_warps": default.num_warps,
        "num_stages": default.num_stages,
    }
    lines.append("  default, all passes:")
    time_config(chosen, ("fwd", "loss", "topk"))
    lines.append("  best, all passes:")
    time_config(best, ("fwd", "loss", "topk"))
    operands.clear()  # it holds them too
    del x, weight, supports
    torch.cuda.empty_cache()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes",
        type=parse_shape,
        nargs="+",
        default=[parse_shape(s) for s in ("64,2.8,32,16", "512,2.8,32,16", "64,2.8,64,32", "512,2.8,128,32")],
        help="B,L in millions,F,G",
    )
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    lines = [f"# {torch.cuda.get_device_name()}, bf16, d = {args.features}: ms (median) and triton / cuda"]
    print(lines[0], flush=True)
    for batch, millions, fan_in, group in args.shapes:
        sweep_shape(batch, millions, fan_in, group, args.features, lines)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
