# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Registers, spills and shared memory of the Triton backward kernels' configurations for sm_90, without a GPU:
`triton.compile` for a Hopper target (pointers and the batch/feature sizes marked 16-divisible, as real launches
are), then Triton's own `ptxas -v` on the PTX. What a launch configuration costs in occupancy before any device
time is spent (issue 38; `triton_backward_notes.md`).

    env -u TRITON_INTERPRET python benchmarks/triton_ptxas.py --out benchmarks/results/triton_backward_ptxas_sm90.txt
"""

import argparse
import itertools
import os
import re
import subprocess
import tempfile

from triton.backends.compiler import GPUTarget
from triton.backends.nvidia import compiler as nvidia
from triton.compiler import ASTSource, compile

from haste_hf.kernels.triton import grad_input, grad_weight


TARGET = GPUTarget("cuda", 90, 32)
SHAPES = [(32, 16), (32, 32), (32, 64), (64, 16), (64, 32), (64, 64), (128, 16), (128, 32), (128, 64)]  # (F, G)


def resources(kernel, signature, constants, divisible, num_warps):
    """(registers a thread, spilled bytes, shared memory bytes) of one compiled configuration."""
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    source = ASTSource(kernel, {**signature, **dict.fromkeys(constants, "constexpr")}, constants, attrs=attrs)
    compiled = compile(source, target=TARGET, options={"num_warps": num_warps, "num_stages": 3})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(compiled.asm["ptx"])
    ptxas = os.path.join(os.path.dirname(nvidia.__file__), "bin", "ptxas")
    log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", handle.name, "-o", os.devnull], capture_output=True)
    os.unlink(handle.name)
    text = log.stderr.decode()
    registers = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", text))
    return registers, spills, compiled.metadata.shared


def grad_input_rows():
    signature = {"grad_out_ptr": "*bf16", "weight_ptr": "*bf16", "supports_ptr": "*i32", "acc_ptr": "*fp32"}
    signature.update(dict.fromkeys(("batch", "num_features", "num_groups", "num_packs", "packs_per_program"), "i32"))
    divisible = ("grad_out_ptr", "weight_ptr", "supports_ptr", "acc_ptr", "batch", "num_features")
    modes = [("fast", 32, 1, 4), ("fast", 32, 2, 4), ("fast", 64, 2, 4), ("det", 32, 1, 4)]
    for (fan_in, group), (mode, block_b, pack, warps) in itertools.product(SHAPES, modes):
        constants = dict(G=group, F=fan_in, BLOCK_G=group, BLOCK_F=fan_in, BLOCK_B=block_b, PACK=pack)
        constants.update(DETERMINISTIC=mode != "fast", PRECISION="tf32", NUM_STAGES=3)
        used = resources(grad_input._grad_input_kernel, signature, constants, divisible, warps)
        yield f"bwd_x {mode:<4} F={fan_in:<3} G={group:<2} block_b={block_b:<2} pack={pack} warps={warps}", used


def grad_weight_rows():
    signature = {"grad_out_ptr": "*bf16", "xt_ptr": "*bf16", "supports_ptr": "*i32", "grad_weight_ptr": "*bf16"}
    signature.update(dict.fromkeys(("batch", "num_groups", "num_packs", "packs_per_program"), "i32"))
    divisible = ("grad_out_ptr", "xt_ptr", "supports_ptr", "grad_weight_ptr", "batch")
    for (fan_in, group), single, pack in itertools.product(SHAPES, (True, False), (1, 2)):
        block_g = group
        block_f = min(fan_in, max(16, 4096 // block_g))
        if pack > 1 and block_f < fan_in:
            continue
        constants = dict(G=group, F=fan_in, BLOCK_G=block_g, BLOCK_F=block_f, BLOCK_B=64, PACK=pack)
        constants.update(SINGLE_CHUNK=single, PRECISION="tf32", NUM_STAGES=3)
        used = resources(grad_weight._grad_weight_kernel, signature, constants, divisible, 4)
        chunks = "one chunk" if single else "chunks"
        yield f"bwd_w {chunks:<13} F={fan_in:<3} G={group:<2} block_b=64 pack={pack} warps=4", used


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: the interpreter compiles nothing")
    lines = ["# sm_90 (Triton's ptxas -v), bf16: registers a thread, spilled bytes, shared memory bytes"]
    print(lines[0], flush=True)
    for label, (registers, spills, shared) in itertools.chain(grad_input_rows(), grad_weight_rows()):
        lines.append(f"{label}  registers {registers:>3}  spills {spills:>4}  shared {shared:>6}")
        print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
