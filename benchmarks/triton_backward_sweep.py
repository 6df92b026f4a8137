# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Sweeps the launch parameters of the Triton tail kernels at given shapes, against the CUDA build in the same run:
how the `launch_defaults` of `grad_input.py` and `grad_weight.py` (and the forward family's `LaunchConfig` at small
batches) were chosen (issue 38).

Per shape (B, L in millions, F, G; d = 768, bf16) it times the CUDA kernels (`haste::` ops) of the weight gradient
(bwd_w), the feature gradient (bwd_x, fast mode; bwd_x_det, deterministic), the forward (fwd), the fused loss
(loss) and top-k (topk), then the Triton kernels under each configuration of the pass (the first: the pass's
default launch at the shape), and prints each time and its ratio to CUDA; `best` lines at the end. Each line is
written to `--out` as it is measured: a call stopped by its time limit keeps every line before. Stops timing new
configurations after `--seconds` (compilations count). A shape may name its passes (`64,8.6,32,16:bwd_x+bwd_w`).
`--compile-only --part i --parts n` runs every n-th configuration once from the i-th and times nothing: n such
processes side by side fill Triton's cache before the timing run.

    python benchmarks/triton_backward_sweep.py --shapes 64,8.6,32,16 512,8.6,128,16:bwd_x
"""

import argparse
import time

import torch
from kernels import median_ms
from triton_forward_sweep import Override, parse_shape

from haste_hf.kernels import ops
from haste_hf.kernels.triton import grad_input as triton_grad_input
from haste_hf.kernels.triton import grad_weight as triton_grad_weight
from haste_hf.kernels.triton.forward import LaunchConfig
from haste_hf.kernels.triton.grad_input import grad_input
from haste_hf.kernels.triton.grad_weight import grad_weight


def configs(names, rows):
    return [dict(zip(names, row)) for row in rows]


# Alternatives to each pass's default launch at the shape (timed first); values over the default's.
FAST = configs(
    ("block_b", "programs_per_sm", "pack", "num_warps"),
    [(32, 4, 1, 4), (32, 4, 2, 4), (32, 8, 1, 4), (32, 8, 2, 4), (64, 4, 1, 4), (64, 4, 2, 4), (32, 4, 1, 2)]
    + [(32, 4, 2, 2)],
)
DETERMINISTIC = configs(("block_b", "programs_per_sm"), [(32, 4), (32, 2), (32, 1), (16, 2)])
WEIGHT = configs(
    ("block_b", "pack", "programs_per_sm", "num_warps"),
    [(64, 1, 16, 4), (64, 2, 16, 4), (64, 1, 8, 4), (64, 1, 32, 4), (64, 1, 16, 8), (32, 1, 16, 4), (64, 2, 16, 8)]
    + [(32, 2, 16, 4)],
)
# LaunchConfig attributes (the forward, the loss and the top-k share them)
FORWARD = configs(("programs_per_processor", "num_warps", "num_stages"), [(4, 4, 3), (16, 4, 3), (8, 8, 3), (8, 4, 2)])
FORWARD += [{"block_b": 32}, {"block_b": 64}]
PASSES = ["bwd_x", "bwd_x_det", "bwd_w", "fwd", "loss", "topk"]


class Output:
    """Prints each line as it comes and writes it to the `--out` file at once (flushed): a run stopped by a time
    limit (SIGTERM, SIGKILL) leaves every line it measured."""

    def __init__(self, path):
        self.handle = open(path, "w") if path else None  # noqa: SIM115 (closed by `close`)

    def __call__(self, line):
        print(line, flush=True)
        if self.handle is not None:
            self.handle.write(line + "\n")
            self.handle.flush()

    def close(self):
        if self.handle is not None:
            self.handle.close()


def parse_sweep_shape(text):
    shape, _, passes = text.partition(":")
    return parse_shape(shape), passes.split("+") if passes else None


def relative_difference(actual, expected):
    if isinstance(actual, (tuple, list)):  # top-k: (scores, columns); the scores compared
        actual, expected = actual[0], expected[0]
    return ((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30)).item()


def operands_of(batch, millions, fan_in, group, features):
    groups = int(millions * 1e6) // group
    x = torch.randn(batch, features, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(groups, group, fan_in, device="cuda", dtype=torch.bfloat16) / fan_in**0.5
    # F distinct features a group (topk of random keys: no [K, d] int64 argsort, which side-by-side compile
    # processes could not all hold at 8.6M labels)
    supports = torch.rand(groups, features, device="cuda").topk(fan_in, dim=1).indices.int().contiguous()
    grad_out = torch.randn(batch, groups * group, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, groups * group, (batch, 8), device="cuda")
    return [(x, weight, supports, grad_out, positions)]


def distinct(default, alternatives):
    """The default launch first, then each alternative (over the default) that differs from every one before."""
    configs = [default]
    for alternative in alternatives:
        config = {**default, **alternative}
        if config not in configs:
            configs.append(config)
    return configs


def haste_calls(batch, groups, group, features):
    """Each pass through the `haste::` ops (served by the backend `ops.set_backend` chose)."""
    haste = torch.ops.haste
    labels = groups * group
    return {
        "bwd_x": lambda x, w, s, g, p: haste.group_sparse_grad_input(g, w, s, features, False),
        "bwd_x_det": lambda x, w, s, g, p: haste.group_sparse_grad_input(g, w, s, features, True),
        "bwd_w": lambda x, w, s, g, p: haste.group_sparse_grad_weight(g, x, s, group),
        "fwd": lambda x, w, s, g, p: haste.group_sparse_forward(x, w, s, None, False),
        "loss": lambda x, w, s, g, p: haste.linear_loss(x, w, None, s, p, labels, 1 / batch, "bce", True, False),
        "topk": lambda x, w, s, g, p: haste.group_sparse_topk(x, w, s, None, 5, labels),
    }


def triton_calls(batch, groups, group, fan_in, features):
    """(pass, config, fn) of every configuration of the sweep at this shape, each pass's default first."""
    calls = []
    fast = triton_grad_input.launch_defaults(batch, groups, group, fan_in, False)
    for config in distinct({k: fast[k] for k in ("block_b", "programs_per_sm", "pack", "num_warps")}, FAST):
        if config["pack"] > 1 and fan_in * group > 2048:  # over Hopper's shared memory at F = G = 64 and beyond
            continue
        calls.append(("bwd_x", config, lambda x, w, s, g, p, c=config: grad_input(g, w, s, features, False, **c)))
    det = triton_grad_input.launch_defaults(batch, groups, group, fan_in, True)
    for config in distinct({k: det[k] for k in ("block_b", "programs_per_sm")}, DETERMINISTIC):
        calls.append(("bwd_x_det", config, lambda x, w, s, g, p, c=config: grad_input(g, w, s, features, True, **c)))
    weight = triton_grad_weight.launch_defaults(batch, groups, group, fan_in, torch.bfloat16)
    for config in distinct({k: weight[k] for k in ("block_b", "pack", "programs_per_sm", "num_warps")}, WEIGHT):
        if config["pack"] > 1 and fan_in * group > 2048:
            continue
        calls.append(("bwd_w", config, lambda x, w, s, g, p, c=config: grad_weight(g, x, s, group, **c)))
    launch = LaunchConfig(batch, groups, group, fan_in, torch.bfloat16, torch.device("cuda"))
    default = {k: getattr(launch, k) for k in ("block_b", "programs_per_processor", "num_warps", "num_stages")}
    family = haste_calls(batch, groups, group, features)
    for name in ("fwd", "loss", "topk"):  # through the `haste::` ops, as CUDA's are timed
        for config in distinct(default, FORWARD):

            def call(x, w, s, g, p, c=config, fn=family[name]):
                with Override(**c):
                    return fn(x, w, s, g, p)

            calls.append((name, config, call))
    return calls


def compile_all(args, deadline):
    """Runs every `parts`-th configuration once from the `part`-th: fills Triton's cache, times nothing."""
    ops.set_backend("triton")
    index = 0
    for (batch, millions, fan_in, group), passes in args.shapes:
        operands = operands_of(batch, millions, fan_in, group, args.features)
        groups = operands[0][1].shape[0]
        for name, _, fn in triton_calls(batch, groups, group, fan_in, args.features):
            if name in (passes or args.passes):
                if index % args.parts == args.part and time.monotonic() < deadline:
                    fn(*operands[0])
                index += 1
        torch.cuda.synchronize()
        del operands
        torch.cuda.empty_cache()


def time_shape(batch, millions, fan_in, group, passes, features, deadline, emit):
    """Times CUDA's kernels and then every Triton configuration of `passes` at one shape, emitting each line as it
    is measured; returns the shape's `best` lines."""
    operands = operands_of(batch, millions, fan_in, group, features)
    groups = operands[0][1].shape[0]
    shape = f"B={batch} L={millions}M F={fan_in} G={group}"
    cuda = haste_calls(batch, groups, group, features)
    ops.set_backend("cuda")
    cuda_ms = {name: median_ms(cuda[name], operands) for name in passes}
    cuda_out = {name: cuda[name](*operands[0]) for name in passes}
    ops.set_backend("triton")
    emit(f"## {shape}: cuda " + " ".join(f"{n} {t:.3f}" for n, t in cuda_ms.items()))
    results = {}
    for name, config, fn in triton_calls(batch, groups, group, fan_in, features):
        if name not in passes or time.monotonic() > deadline:
            continue
        diff = relative_difference(fn(*operands[0]), cuda_out[name])
        ms = median_ms(fn, operands)
        results.setdefault(name, []).append((ms, config))
        emit(f"  {name:<9} {config} {ms:.3f} ({ms / cuda_ms[name]:.2f}) diff {diff:.1e}")
    best = []
    for name, rows in results.items():
        ms, config = min(rows, key=lambda row: row[0])
        first = rows[0][0]
        best.append(
            f"# best {shape} {name}: {config} {ms:.3f} ms ({ms / cuda_ms[name]:.2f}; default "
            f"{first / cuda_ms[name]:.2f})"
        )
    del operands, cuda_out
    torch.cuda.empty_cache()
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes", type=parse_sweep_shape, nargs="+", required=True, help="B,L in millions,F,G[:passes]"
    )
    parser.add_argument("--passes", nargs="+", choices=PASSES, default=PASSES)
    parser.add_argument("--features", type=int, default=768)
    parser.add_argument("--seconds", type=float, default=240)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--part", type=int, default=0)
    parser.add_argument("--parts", type=int, default=1)
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    if args.compile_only:
        compile_all(args, deadline)
        return
    if not ops.is_available():
        raise SystemExit("the CUDA kernels are not available here: nothing to compare with")
    emit = Output(args.out)
    try:
        emit(f"# {torch.cuda.get_device_name()}, bf16, d = {args.features}: ms (median), triton / cuda")
        best = []
        for (batch, millions, fan_in, group), passes in args.shapes:
            if time.monotonic() > deadline:
                emit(f"# stopped by --seconds {args.seconds:g} before B={batch} F={fan_in} G={group}")
                break
            best += time_shape(batch, millions, fan_in, group, passes or args.passes, args.features, deadline, emit)
        for line in best:
            emit(line)
    finally:
        emit.close()


if __name__ == "__main__":
    main()
