# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""What the tail's kernels cost a process before its first step: compilation on first use, then the cache.

For each backend it runs the same child process twice on an empty cache folder (Triton's `TRITON_CACHE_DIR`, or
the CUDA build's `HASTE_HF_KERNEL_CACHE`): the child imports torch and haste_hf, then times (wall clock, synchronized)
what a training step and `predict_topk` call first: the tail's forward and both gradients, the fused loss with its
backward, the dense head's fused loss and the fused top-k, at bf16, G = 32, F = 64. The first run compiles (and
builds), the second finds everything cached. Also the same calls once more in the child, warm, for reference.

    python benchmarks/first_use.py                      # both backends
    python benchmarks/first_use.py --backends triton
"""

import argparse
import os
import subprocess
import sys
import tempfile


CHILD = r"""
import time
import torch
start = time.perf_counter()
from haste_hf.kernels import ops


def calls():
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(128, 768, device="cuda", generator=generator).bfloat16().requires_grad_()
    weight = (torch.randn(2000, 32, 64, device="cuda", generator=generator) / 8).bfloat16().requires_grad_()
    supports = torch.rand(2000, 768, device="cuda", generator=generator).argsort(dim=1)[:, :64].int().contiguous()
    head = (torch.randn(3000, 768, device="cuda", generator=generator) / 28).bfloat16().requires_grad_()
    positions = torch.randint(0, 64000, (128, 8), device="cuda", generator=generator)
    out = ops.group_sparse_linear(x, weight, supports)
    out.backward(torch.randn_like(out))
    ops.linear_loss(x, weight, None, supports, positions, 64000, 1 / 128, "bce").backward()
    ops.linear_loss(x, head, None, None, positions, 3000, 1 / 128, "bce").backward()
    with torch.no_grad():
        ops.group_sparse_topk(x, weight, supports, None, 5, 64000)
    torch.cuda.synchronize()


assert ops.is_available(), "the kernels are not available"
imported = time.perf_counter()
calls()
first = time.perf_counter()
calls()
again = time.perf_counter()
print(f"RESULT import {imported - start:.2f} first {first - imported:.2f} warm {again - first:.3f}")
"""


def run_child(backend: str, cache: str) -> dict:
    environment = dict(os.environ, HASTE_HF_KERNELS=backend, TRITON_CACHE_DIR=cache, HASTE_HF_KERNEL_CACHE=cache)
    done = subprocess.run([sys.executable, "-c", CHILD], env=environment, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {backend} child failed:\n{done.stdout}\n{done.stderr}")
    values = lines[-1].split()[1:]
    return {values[i]: float(values[i + 1]) for i in range(0, len(values), 2)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["triton", "cuda"], choices=["triton", "cuda"])
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    lines = ["| backend | process | import haste_hf s | first calls s | same calls again s |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for backend in args.backends:
        with tempfile.TemporaryDirectory(prefix=f"haste-{backend}-cache-") as cache:
            for process in ("first (empty cache)", "later (cached)"):
                result = run_child(backend, cache)
                line = (
                    f"| {backend} | {process} | {result['import']:.2f} | {result['first']:.2f} | {result['warm']:.3f} |"
                )
                lines.append(line)
                print(line, flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
