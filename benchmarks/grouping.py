# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Semantic label grouping speed and quality on synthetic clustered label embeddings.

Targets (design/performance.md): 670K labels x 384 dims in <= 10 min on 2 CPU cores; 8.6M labels in <= 60 s
on one GPU. Quality is the paper's objective (mean cosine similarity of a label to its group centroid), shown
beside the same figure for a random grouping.

    python benchmarks/grouping.py              # CPU case, then the GPU case when CUDA is available
    python benchmarks/grouping.py --gpu-only
"""

import argparse
import time

import torch
import torch.nn.functional as F

from haste_hf.labels.grouping import group_labels, grouping_objective


def clustered_embeddings(
    label_count: int, dim: int, labels_per_topic: int, noise: float, device: torch.device, seed: int = 0
) -> torch.Tensor:
    """Unit label embeddings scattered around random topic directions (cosine to the topic about
    `1 / sqrt(1 + noise**2)`), generated in chunks to bound the peak memory."""
    generator = torch.Generator(device=device).manual_seed(seed)
    num_topics = max(1, label_count // labels_per_topic)
    topics = F.normalize(torch.randn(num_topics, dim, generator=generator, device=device), dim=1)
    embeddings = torch.empty(label_count, dim, device=device)
    chunk = 1 << 20
    for start in range(0, label_count, chunk):
        rows = min(chunk, label_count - start)
        topic = torch.randint(num_topics, (rows,), generator=generator, device=device)
        noise_rows = torch.randn(rows, dim, generator=generator, device=device) * (noise / dim**0.5)
        embeddings[start : start + rows] = F.normalize(topics[topic] + noise_rows, dim=1)
    return embeddings


def run_case(label_count: int, dim: int, group_size: int, beta: float, device: torch.device, args) -> dict:
    embeddings = clustered_embeddings(label_count, dim, args.labels_per_topic, args.noise, device)
    label_ids = torch.arange(label_count)
    if device.type == "cuda":  # CUDA context, cuBLAS handles and kernels are warmed up outside the timing
        group_labels(embeddings[:100_000], label_ids[:100_000], group_size, beta=beta, device=device)
        torch.cuda.synchronize()
    start = time.perf_counter()
    grouping = group_labels(embeddings, label_ids, group_size, beta=beta, seed=0, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if not torch.equal(torch.sort(grouping.order).values, label_ids):
        raise AssertionError("the grouping is not a permutation of the labels")
    random_grouping = group_labels(None, label_ids, group_size, "random", seed=0)
    return {
        "labels": label_count,
        "dim": dim,
        "G": group_size,
        "beta": beta,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu x{torch.get_num_threads()}",
        "seconds": seconds,
        "objective": grouping_objective(embeddings, grouping, device=device),
        "random objective": grouping_objective(embeddings, random_grouping, device=device),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-labels", type=int, default=670_091)
    parser.add_argument("--gpu-labels", type=int, default=8_623_847)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[16])
    parser.add_argument("--beta", type=float, default=16)
    parser.add_argument("--labels-per-topic", type=int, default=64)
    parser.add_argument("--noise", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for the CPU case")
    selection = parser.add_mutually_exclusive_group()
    selection.add_argument("--cpu-only", action="store_true")
    selection.add_argument("--gpu-only", action="store_true")
    args = parser.parse_args()

    cases = []
    if not args.gpu_only:
        torch.set_num_threads(args.threads)
        cases += [(args.cpu_labels, torch.device("cpu"))]
    if not args.cpu_only:
        if torch.cuda.is_available():
            cases += [(args.gpu_labels, torch.device("cuda"))]
        else:
            print("CUDA is not available: skipping the GPU case.")

    columns = ["labels", "dim", "G", "beta", "device", "seconds", "objective", "random objective"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for label_count, device in cases:
        for group_size in args.group_sizes:
            row = run_case(label_count, args.dim, group_size, args.beta, device, args)
            cells = [f"{row[c]:.3f}" if isinstance(row[c], float) and c != "beta" else str(row[c]) for c in columns]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
