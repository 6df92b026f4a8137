# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Sweeps the launch configuration of the Triton fused loss (`haste_hf.kernels.triton.loss.sparse_loss`: rows per
tile, warps, pipeline stages, programs per multiprocessor) against the CUDA build's fused loss in the same run, BCE
storing its logit gradient, bf16, d = 768: how `sparse_loss`'s choices were made.

    python benchmarks/triton_loss_sweep.py
    python benchmarks/triton_loss_sweep.py --shapes 512,8.6,32,64 128,8.6,64,32 --configs 64,8,3,8 128,8,3,8
"""

import argparse

import torch
from kernels import median_ms, report, sweep_operands

from haste_hf.kernels import ops
from haste_hf.kernels.triton import loss as triton_loss


def parse(text, kinds):
    return tuple(kind(value) for kind, value in zip(kinds, text.split(",")))


def sweep_shape(shape, configs, features, lines):
    batch, millions, fan_in, group = shape
    labels, operands = sweep_operands(batch, millions, fan_in, group, features)

    def fused(x, w, s, p):
        return torch.ops.haste.linear_loss(x, w, None, s, p, labels, 1 / batch, "bce", True, False)

    ops.set_backend("cuda")
    cuda_ms = median_ms(fused, operands)
    expected = fused(*operands[0])
    ops.set_backend("triton")
    default_ms = median_ms(fused, operands)
    head = (
        f"## B={batch} L={labels / 1e6:.2f}M F={fan_in} G={group}: cuda {cuda_ms:.3f} triton default {default_ms:.3f}"
    )
    report(lines, head)
    for block_b, warps, stages, per_processor in configs:
        tile = dict(block_b=block_b, num_warps=warps, num_stages=stages, programs_per_processor=per_processor)
        ms = median_ms(lambda *args, tile=tile: fused_with(tile, *args, labels, batch), operands)
        value, grad = fused_with(tile, *operands[0], labels, batch)
        error = ((grad.float() - expected[1].float()).norm() / expected[1].float().norm()).item()
        line = (
            f"  block_b {block_b:>3} warps {warps} stages {stages} per_sm {per_processor}: {ms:8.3f} ms "
            f"{ms / cuda_ms:5.2f}x cuda (grad rel. diff {error:.1e})"
        )
        report(lines, line)


def fused_with(tile, x, weight, supports, positions, labels, batch):
    """`sparse_loss` with the tile `tile` in place of its own choice (`loss_tile`)."""
    original = triton_loss.loss_tile

    def chosen(config):
        config.block_b = tile["block_b"]
        config.num_stages = tile["num_stages"]
        config.programs_per_processor = tile["programs_per_processor"]
        return tile["num_warps"]

    triton_loss.loss_tile = chosen
    try:
        mask = triton_loss.positive_mask(positions, labels, labels)
        return triton_loss.sparse_loss(x, weight, supports, None, mask, labels, 1 / batch, 0, True)
    finally:
        triton_loss.loss_tile = original


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["512,8.6,32,64", "512,8.6,64,16", "64,8.6,32,16"])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["64,4,3,8", "64,8,3,8", "128,8,3,8", "64,4,2,8", "128,8,2,8", "32,4,3,8", "64,8,3,4"],
        help="block_b,num_warps,num_stages,programs_per_processor",
    )
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    configs = [parse(text, (int, int, int, int)) for text in args.configs]
    lines = [f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16 BCE with its gradient, ms (median)"]
    print(lines[0], flush=True)
    for text in args.shapes:
        sweep_shape(parse(text, (int, float, int, int)), configs, args.features, lines)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
