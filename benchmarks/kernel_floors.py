# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Lower bounds on the time of each pass of the group-sparse tail, set against the FLOPs-matched dense
times of a `benchmarks/kernels.py --out` table: which (shape, pass) points can reach a target ratio at
all, whatever the kernel.

Per pass the floor is the larger of two times, each at the device's peak rate (so it is a bound, not a
forecast):
  * device memory: every operand read once and every result written once
    (fwd: weights + supports + x + logits; bwd_w: logit gradients + supports + x + weight gradient;
    bwd_x: logit gradients + weights + supports + feature gradient), over the peak DRAM bandwidth;
  * on chip: the feature gradient adds B * K * F fp32 partial sums (one per batch row, group and slot)
    into accumulators picked by the data (the support's feature), so each is a read and a write of
    4 bytes in shared memory; the forward and the weight gradient gather B * K * F 16-bit elements.
    Over the peak shared-memory bandwidth (bytes per clock per SM x SMs x boost clock).

    python benchmarks/kernel_floors.py benchmarks/results/kernels_h100.txt
"""

import argparse
import re
import sys


ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)M\s+(\d+)\s+(\d+)\s+(fwd|bwd_w|bwd_x)\s+([\d.]+)\s+(\S+)\s+([\d.]+)")


def read_table(path):
    """(B, L, F, G, pass) -> (ours ms, FLOPs-matched ms); the last row of a repeated shape wins."""
    rows = {}
    with open(path) as handle:
        for line in handle:
            match = ROW.match(line)
            if match:
                batch, labels, fan_in, group, name, ours, _, flops = match.groups()
                key = (int(batch), round(float(labels) * 1e6), int(fan_in), int(group), name)
                rows[key] = (float(ours), float(flops))
    return rows


def floor_ms(batch, labels, fan_in, group, name, features, dram_bytes_per_s, shared_bytes_per_s):
    groups = labels // group
    logits = batch * labels * 2
    weights = labels * fan_in * 2
    supports = groups * fan_in * 4
    x = batch * features * 2
    partials = batch * groups * fan_in
    dram = {
        "fwd": weights + supports + x + logits,
        "bwd_w": logits + supports + x + weights,
        "bwd_x": logits + weights + supports + x,
    }[name]
    on_chip = partials * (8 if name == "bwd_x" else 2)
    return 1e3 * max(dram / dram_bytes_per_s, on_chip / shared_bytes_per_s)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", help="a benchmarks/kernels.py --out table")
    parser.add_argument("--features", type=int, default=768, help="d of the table's run")
    parser.add_argument("--target", type=float, default=1.15, help="ratio to FLOPs-matched dense")
    parser.add_argument("--dram-tb-per-s", type=float, default=3.35, help="peak DRAM bandwidth (H100 SXM: 3.35)")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--shared-bytes-per-clock", type=int, default=128, help="per SM (Hopper: 32 banks x 4 B)")
    parser.add_argument("--clock-ghz", type=float, default=1.98, help="boost clock (H100 SXM: 1.98)")
    args = parser.parse_args(argv)
    rows = read_table(args.table)
    if not rows:
        sys.exit(f"no benchmark rows in {args.table}")
    dram = args.dram_tb_per_s * 1e12
    shared = args.sms * args.shared_bytes_per_clock * args.clock_ghz * 1e9
    print(
        f"# floors at DRAM {args.dram_tb_per_s} TB/s, shared memory {shared / 1e12:.1f} TB/s; ratios to FLOPs-matched"
    )
    print(
        f"{'B':>4} {'L':>8} {'F':>4} {'G':>3} {'pass':<6} {'floor':>8} {'flops':>8} {'ours':>8} "
        f"{'floor/fl':>8} {'ours/fl':>8}"
    )
    unreachable = {}
    for (batch, labels, fan_in, group, name), (ours, flops) in sorted(rows.items(), key=lambda item: item[0]):
        floor = floor_ms(batch, labels, fan_in, group, name, args.features, dram, shared)
        print(
            f"{batch:>4} {labels / 1e6:7.2f}M {fan_in:>4} {group:>3} {name:<6} {floor:8.3f} {flops:8.3f} "
            f"{ours:8.3f} {floor / flops:8.2f} {ours / flops:8.2f}"
        )
        if floor / flops > args.target:
            unreachable.setdefault(name, []).append((batch, labels, fan_in, group, floor / flops))
    for name in ("fwd", "bwd_w", "bwd_x"):
        points = unreachable.get(name, [])
        total = sum(key[-1] == name for key in rows)
        print(f"# {name}: {len(points)}/{total} points whose floor alone exceeds {args.target}x FLOPs-matched dense")
        for batch, labels, fan_in, group, ratio in points:
            print(f"#   B={batch} L={labels / 1e6:.2f}M F={fan_in} G={group}: floor {ratio:.2f}x")


if __name__ == "__main__":
    main()
