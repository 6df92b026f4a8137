# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The output layer sharded by labels over N GPUs (`haste_hf.training.sharded_output_layer`): predicted on one GPU, measured on N.

--mode emulate (one GPU): one rank of an N-way split, for each N. The rank holds L/N labels (its share of
the head's rows and of the tail's groups, bf16, SGD with fp32 momentum) and scores them over the global
batch N x B of gathered features: the fused BCE of each slice (`losses.output_layer_loss`), backward, SGD
step, as `ShardedOutputLayer.forward` does. Measured: that time and its peak memory per rank, and once the encoder's
step (MPNet-base-sized random encoder, B texts of T tokens, bf16 autocast, AdamW), the same on every rank
whatever N. Computed: the bytes each collective moves per step, and from all of these the texts/s of N
GPUs at a stated interconnect bandwidth, with no overlap of communication and compute (a lower bound
where DDP overlaps its all-reduce with the backward pass). The replicated layout (every GPU the whole
output layer, its gradient all-reduced) is predicted alongside.

--mode real (under torchrun, N processes): HASTE training steps of the whole model, sharded (default) or
`--replicated`, on random tokens: texts/s over all ranks and peak memory per rank.

    python benchmarks/distributed.py --out results/distributed_emulation_h100.txt
    torchrun --nproc-per-node 2 benchmarks/distributed.py --mode real [--replicated]
"""

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch


# Run as a script, this folder heads sys.path, and its kernels.py would shadow the `kernels` package that
# transformers probes for.
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != os.path.dirname(os.path.abspath(__file__))]

MIB = 2**20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("emulate", "real"), default="emulate")
    parser.add_argument("--labels", type=int, default=8_600_000)
    parser.add_argument("--head-fraction", type=float, default=0.03)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--fan-in", type=int, default=64)
    parser.add_argument("--positives", type=int, default=5, help="Positive labels per text.")
    parser.add_argument("--batch", type=int, default=128, help="Texts per GPU.")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768, help="Encoder width (768, 12 layers: MPNet-base).")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30527)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="Emulated N.")
    parser.add_argument(
        "--bandwidth",
        type=float,
        nargs="+",
        default=[360.0, 40.0],
        help="Interconnect bus bandwidths (GB/s) to predict with: NCCL on NVLink 4, PCIe 5.",
    )
    parser.add_argument("--replicated", action="store_true", help="--mode real: replicate the output layer.")
    parser.add_argument("--steps", type=int, default=10, help="Timed steps (after 3 warm-up steps).")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="Also write the table to this file.")
    parser.add_argument(
        "--momentum-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="The output layer's SGD momentum.",
    )
    parser.add_argument(
        "--chunked-backward",
        action="store_true",
        help="The loss backward in label chunks (no [N x B, L/N] logit gradient).",
    )
    parser.add_argument(
        "--chunk-labels",
        type=int,
        default=0,
        help="Labels per chunk (0: 2^27 logit-gradient elements).",
    )
    parser.add_argument(
        "--fused-update",
        action="store_true",
        help="The SGD step fused into the loss backward (no weight gradient).",
    )
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="--mode real: the encoder recomputes its blocks' activations in the backward.",
    )
    return parser.parse_args(argv)


def state_bytes_per_parameter(args) -> int:
    """bf16 weight, its bf16 gradient (none with the fused update), and the momentum."""
    return 2 + (0 if args.fused_update else 2) + (2 if args.momentum_dtype == "bfloat16" else 4)


def memory_options(args) -> str:
    chosen = [
        f"SGD, {'fp32' if args.momentum_dtype == 'float32' else 'bf16'} momentum",
        "chunked loss backward" if args.chunked_backward or args.fused_update else None,
        "fused update" if args.fused_update else None,
    ]
    return ", ".join(option for option in chosen if option)


# ------------------------------------------------------------------------------------------------ shapes


def layout(args, world_size: int) -> dict:
    """Label counts of one rank of `world_size`: head rows, tail groups (as `assign_output_layer`)."""
    head = math.floor(args.head_fraction * args.labels + 0.5)
    groups = -(-(args.labels - head) // args.group_size)
    return {
        "head": -(-head // world_size),
        "groups": -(-groups // world_size),
        "head_total": head,
        "groups_total": groups,
    }


def encoder_config(args, config_class):
    return config_class(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.seq_len + 2,
    )


def collectives(args, world_size: int, encoder_parameters: int) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(what, operation, bytes, layouts using it) of each collective of one training step; bytes are those
    of the tensor it produces on every rank (the gathered rows, the reduced vector)."""
    rows = world_size * args.batch
    shape = layout(args, 1)
    output_parameters = shape["groups_total"] * args.group_size * args.fan_in + shape["head_total"] * (args.hidden + 1)
    return [
        ("batch sizes, label widths (int64)", "all_gather", 2 * world_size * 8, ("sharded",)),
        ("branch inputs (bf16)", "all_gather", rows * args.hidden * 2, ("sharded",)),
        ("positive label ids (int64)", "all_gather", rows * args.positives * 8, ("sharded",)),
        ("per-example loss (fp32)", "all_reduce", rows * 4, ("sharded",)),
        ("feature gradient (bf16)", "reduce_scatter", rows * args.hidden * 2, ("sharded",)),
        ("encoder gradient, DDP (fp32)", "all_reduce", encoder_parameters * 4, ("sharded", "replicated")),
        ("output-layer gradient, DDP (bf16)", "all_reduce", output_parameters * 2, ("replicated",)),
    ]


def communication_seconds(steps, world_size: int, bus_bandwidth: float, layout_name: str) -> float:
    """Ring algorithms: (N-1)/N of the bytes cross each link for a gather or scatter, 2(N-1)/N for an
    all-reduce, at `bus_bandwidth` GB/s."""
    share = (world_size - 1) / world_size
    return sum(
        (2 * share if operation == "all_reduce" else share) * size / (bus_bandwidth * 1e9)
        for _, operation, size, layouts in steps
        if layout_name in layouts
    )


# ------------------------------------------------------------------------------------------------ timing


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(step, device, steps: int) -> tuple[float, float]:
    """(median seconds of `step`, peak bytes allocated during it beyond what was allocated before)."""
    for _ in range(3):
        step()
    synchronize(device)
    before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    return sorted(times)[len(times) // 2], max(0, peak - before) + before


def chunk_output_layer_backward(args, optimizer, parameters) -> None:
    """`--chunked-backward` / `--fused-update` on the head and tail weights among `parameters`, as `HasteTrainer`
    sets them up."""
    if not (args.chunked_backward or args.fused_update):
        return
    from haste_hf.modeling.losses import chunk_loss_backward_

    for param in parameters:
        if param.dim() >= 2:
            update = (
                (lambda rows, grad, param=param: optimizer.update_rows_(param, rows, grad))
                if args.fused_update
                else None
            )
            chunk_loss_backward_(param, args.chunk_labels, update)


def output_layer_step(args, world_size: int, device):
    """One rank's output layer of a `world_size`-way split and a closure doing its step over the global batch:
    the fused loss on each slice (`ShardedOutputLayer.scored_loss`), backward, SGD step."""
    from haste_hf.modeling.losses import output_layer_loss
    from haste_hf.modeling.output_layer import GroupSparseLinear, random_supports
    from haste_hf.training.optimization import StochasticRoundingSGD

    shape = layout(args, world_size)
    rows = world_size * args.batch
    head = torch.nn.Linear(args.hidden, shape["head"], device=device, dtype=torch.bfloat16) if shape["head"] else None
    tail = GroupSparseLinear(args.hidden, shape["groups"], args.group_size, args.fan_in).to(
        device=device, dtype=torch.bfloat16
    )
    with torch.no_grad():
        tail.weight.uniform_(-1 / math.sqrt(args.fan_in), 1 / math.sqrt(args.fan_in))
        tail.supports.copy_(random_supports(shape["groups"], args.fan_in, args.hidden, seed=0))
    parameters = [*(head.parameters() if head is not None else ()), tail.weight]
    optimizer = StochasticRoundingSGD(
        parameters, lr=0.05, momentum=0.9, weight_decay=1e-4, momentum_dtype=getattr(torch, args.momentum_dtype)
    )
    chunk_output_layer_backward(args, optimizer, parameters)
    features = torch.randn(rows, args.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    tail_columns = shape["groups"] * args.group_size
    positions = torch.randint(0, shape["head"] + tail_columns, (rows, args.positives), device=device)

    def step():
        loss = output_layer_loss(
            features, tail.weight, None, positions - shape["head"], tail_columns, 1 / rows, supports=tail.supports
        )
        if head is not None:
            loss = loss + output_layer_loss(features, head.weight, head.bias, positions, shape["head"], 1 / rows)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        features.grad = None

    return step, sum(p.numel() for p in parameters)


def encoder_step(args, device):
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    encoder = MPNetModel(encoder_config(args, MPNetConfig), add_pooling_layer=False).to(device)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=5e-5)
    input_ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), device=device)
    mask = torch.ones_like(input_ids)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            states = encoder(input_ids=input_ids, attention_mask=mask)[0]
        pooled = states.float().mean(1)
        pooled.backward(torch.randn_like(pooled))  # stands for the gradient the output layer sends back
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, sum(p.numel() for p in encoder.parameters())


def device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def commit() -> str:
    """The commit of the tree that runs, and where it was read (`provenance.py`: `HASTE_COMMIT`, else git)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("provenance", Path(__file__).with_name("provenance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tree_commit()


def emulate(args) -> str:
    device = torch.device(args.device)
    lines = [
        f"# {device_name(device)}, torch {torch.__version__}, commit {commit()}",
        f"# L = {args.labels:,} labels (head {args.head_fraction:.0%}, tail G = {args.group_size}, F = {args.fan_in}), "
        f"d = {args.hidden}, {args.positives} positives per text, bf16 output layer ({memory_options(args)})",
        f"# encoder: MPNet architecture ({args.layers} layers, d = {args.hidden}; 12 and 768 are MPNet-base), random weights, {args.batch} texts x "
        f"{args.seq_len} tokens per GPU, bf16 autocast, AdamW",
    ]
    step, encoder_parameters = encoder_step(args, device)
    encoder_seconds, encoder_peak = measure(step, device, args.steps)
    del step
    lines.append(
        f"# encoder step per GPU: {1e3 * encoder_seconds:.1f} ms, peak {encoder_peak / MIB:,.0f} MiB, "
        f"{encoder_parameters / 1e6:.1f}M parameters"
    )
    if device.type == "cuda":
        torch.cuda.empty_cache()
    measured = {}
    for world_size in args.world_sizes:
        step, parameters = output_layer_step(args, world_size, device)
        measured[world_size] = (*measure(step, device, args.steps), parameters)
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    one_gpu_texts = args.batch / (encoder_seconds + measured[min(measured)][0])

    lines.append("")
    lines.append("One rank of an N-way split: its L/N labels over the global batch N x B (measured)")
    lines.append(
        f"(state: bf16 weights{'' if args.fused_update else ' and gradients'} and {args.momentum_dtype} momentum, "
        f"{state_bytes_per_parameter(args)} bytes a parameter; the rest of the peak is the"
    )
    lines.append(" step's transient memory)")
    lines.append(
        f"{'N':>3} {'labels/rank':>12} {'batch':>6} {'out-layer ms':>13} {'peak MiB':>10} {'params/rank':>12} {'state MiB':>10}"
    )
    for world_size, (seconds, peak, parameters) in measured.items():
        labels = layout(args, world_size)
        labels = labels["head"] + labels["groups"] * args.group_size
        lines.append(
            f"{world_size:>3} {labels:>12,} {world_size * args.batch:>6} {1e3 * seconds:>13.1f} "
            f"{peak / MIB:>10,.0f} {parameters / 1e6:>11.1f}M {state_bytes_per_parameter(args) * parameters / MIB:>10,.0f}"
        )

    lines.append("")
    lines.append("Bytes of each collective per step (MiB)")
    per_size = {n: collectives(args, n, encoder_parameters) for n in args.world_sizes}
    lines.append(
        f"{'collective':<36} {'operation':<15} {'layouts':<20}"
        + "".join(f"{'N=' + str(n):>10}" for n in args.world_sizes)
    )
    for index, (name, operation, _, layouts) in enumerate(per_size[args.world_sizes[0]]):
        sizes = "".join(f"{per_size[n][index][2] / MIB:>10.3f}" for n in args.world_sizes)
        lines.append(f"{name:<36} {operation:<15} {'+'.join(layouts):<20}{sizes}")

    lines.append("")
    lines.append("Predicted texts/s of N GPUs: step = encoder + output layer + communication (not overlapped)")
    lines.append(
        f"{'layout':<11} {'GB/s':>6} {'N':>3} {'step ms':>8} {'comm ms':>8} {'texts/s':>9} {'vs 1 GPU':>9} {'out-layer peak MiB/GPU':>23}"
    )
    for bandwidth in args.bandwidth:
        for world_size in args.world_sizes:
            # Replicated, every GPU runs the 1-GPU output layer on its own batch.
            for name, emulated in (("sharded", world_size), ("replicated", 1)):
                if world_size == 1 and name == "replicated" or emulated not in measured:
                    continue
                seconds, peak, _ = measured[emulated]
                communication = communication_seconds(per_size[world_size], world_size, bandwidth, name)
                step_seconds = encoder_seconds + seconds + communication
                texts = world_size * args.batch / step_seconds
                label = "1 GPU" if world_size == 1 else name
                lines.append(
                    f"{label:<11} {bandwidth:>6.0f} {world_size:>3} {1e3 * step_seconds:>8.1f} {1e3 * communication:>8.2f} "
                    f"{texts:>9.0f} {texts / one_gpu_texts:>8.2f}x {peak / MIB:>23,.0f}"
                )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ real runs


def real(args) -> str | None:
    import torch.distributed as dist

    from haste_hf.training.distributed import end_process_group

    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    results = every_rank_timing(args, device)
    rank = dist.get_rank()
    end_process_group()  # after the model, its DDP wrapper and optimizers are gone with the function that built them
    if rank != 0:
        return None
    return real_table(args, device, results)


def every_rank_timing(args, device) -> list[tuple[float, int]]:
    """Every rank's (median step seconds, peak bytes), on every rank: the model, its DDP wrapper and optimizers live
    and die in here, so that none holds the process group when it ends."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import MPNetConfig

    from haste_hf import HasteConfig, HasteForExtremeClassification
    from haste_hf.modeling.initialization import deferred_output_rows
    from haste_hf.training.optimization import HasteOptimizer, StochasticRoundingSGD
    from haste_hf.training.sharded_output_layer import ignore_shards_in_ddp, shard_output_layer_
    from haste_hf.training.trainer import DDP_TAKES_FORWARD_SYNC_BUFFERS, split_parameters

    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    shape = layout(args, 1)
    config = HasteConfig(
        encoder=encoder_config(args, MPNetConfig),
        label_count=args.labels,
        head_label_count=shape["head_total"],
        group_size=args.group_size,
        fan_in=args.fan_in,
    )
    if args.fused_update and args.replicated and world_size > 1:
        raise SystemExit("--fused-update needs the sharded output layer: a replicated one all-reduces its gradient")
    # Sharded, each rank builds only its rows of the head and tail (the whole layer of 10^9 labels fits no host).
    with deferred_output_rows(not args.replicated):
        model = HasteForExtremeClassification(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    for module in (model.output_layer.head, model.output_layer.tail):
        module.to(torch.bfloat16)  # before sharding: a rank builds its rows in bf16, never in fp32
    if not args.replicated:
        shard_output_layer_(model)
        ignore_shards_in_ddp(model)
    model.to(device)
    # torch 2.13 renamed it and warns on the old name
    no_buffer_sync = "forward_sync_buffers" if DDP_TAKES_FORWARD_SYNC_BUFFERS else "broadcast_buffers"
    wrapped = DistributedDataParallel(model, **{no_buffer_sync: False})
    encoder_side, output_layer = split_parameters(model)
    output_optimizer = StochasticRoundingSGD(
        output_layer,
        lr=0.05,
        momentum=0.9,
        weight_decay=1e-4,
        seed=rank if not args.replicated else 0,
        momentum_dtype=getattr(torch, args.momentum_dtype),
    )
    chunk_output_layer_backward(args, output_optimizer, output_layer)
    optimizer = HasteOptimizer(torch.optim.AdamW([p for _, p in encoder_side], lr=5e-5), output_optimizer)
    generator = torch.Generator().manual_seed(rank)
    input_ids = torch.randint(5, args.vocab, (args.batch, args.seq_len), generator=generator).to(device)
    labels = torch.randint(0, args.labels, (args.batch, args.positives), generator=generator).to(device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = wrapped(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds, peak = measure(step, device, args.steps)
    results = [None] * world_size
    dist.all_gather_object(results, (seconds, peak))
    return results


def real_table(args, device, results: list[tuple[float, int]]) -> str:
    world_size = len(results)
    slowest = max(result[0] for result in results)
    return "\n".join(
        [
            f"# {device_name(device)} x {world_size}, torch {torch.__version__}, commit {commit()}, "
            f"{'replicated' if args.replicated else 'sharded'} output layer, {memory_options(args)}"
            + (", encoder checkpointing" if args.gradient_checkpointing else ""),
            f"# L = {args.labels:,}, G = {args.group_size}, F = {args.fan_in}, d = {args.hidden}, {args.layers} layers, "
            f"{args.batch} texts x {args.seq_len} tokens per GPU",
            f"step {1e3 * slowest:.1f} ms (slowest rank), {world_size * args.batch / slowest:,.0f} texts/s, "
            f"peak memory per rank (MiB): {', '.join(f'{result[1] / MIB:,.0f}' for result in results)}",
        ]
    )


def main(argv=None):
    args = parse_args(argv)
    table = emulate(args) if args.mode == "emulate" else real(args)
    if table is not None:
        print(table)
        if args.out:
            with open(args.out, "w") as f:
                f.write(table + "\n")


if __name__ == "__main__":
    sys.exit(main())
