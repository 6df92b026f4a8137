"""Each collective of `haste_hf.training.distributed` on two gloo ranks with shares of unequal sizes:
`torchrun --nproc_per_node 2 distributed_collectives.py OUT` (from tests/training/test_distributed.py) writes
OUT/rank-R.pt, what each call gave on that rank; the test compares it with what the rows of both ranks give by hand.

Rank r holds `rows(r, counts[r])`; gradients come from the same weights on every rank.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from haste_hf.training import distributed


COUNTS = [3, 1]
SHORT_FIRST = [1, 3]  # a rank before the last with fewer rows: its padding must not land on the next rank's rows
EQUAL = [2, 2]


def rows(rank: int, count: int) -> torch.Tensor:
    return torch.randn(count, 2, generator=torch.Generator().manual_seed(10 + rank))


def weights(count: int) -> torch.Tensor:
    return torch.randn(count, 2, generator=torch.Generator().manual_seed(99))


def gathered_to_cpu(x, counts, dst, chunk_rows):
    """`gather_rows_to_cpu` with pieces of `chunk_rows` rows a rank, and how many pieces it sent."""
    calls, gather = [], dist.gather
    distributed._GATHER_CHUNK_BYTES = chunk_rows * x[0].nbytes * dist.get_world_size()
    distributed.dist.gather = lambda *args, **kwargs: calls.append(1) or gather(*args, **kwargs)
    try:
        return distributed.gather_rows_to_cpu(x, counts, dst=dst), len(calls)
    finally:
        distributed.dist.gather = gather


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {"device": distributed.communication_device()}
    results["sizes"] = distributed.all_gather_sizes([rank, 2**40 + rank])
    for name, counts in (("unequal", COUNTS), ("equal", EQUAL)):
        x = rows(rank, counts[rank])
        results[f"gather_{name}"] = distributed.all_gather_rows(x, counts)
        results[f"reduce_{name}"] = distributed.reduce_scatter_rows(rows(rank, sum(counts)), counts)
    for scale in (1.0, 0.5, 2.0, 0.0):
        x = rows(rank, COUNTS[rank]).requires_grad_()
        gathered = distributed.gather_rows_with_gradient(x, COUNTS, grad_scale=scale)
        (gathered * weights(sum(COUNTS))).sum().backward()
        results[f"gradient_{scale}"] = (gathered.detach(), x.grad)
    for dst in (0, 1):
        for chunk_rows in (1, 2):
            results[f"to_cpu_{dst}_{chunk_rows}"] = gathered_to_cpu(rows(rank, COUNTS[rank]), COUNTS, dst, chunk_rows)
    for dst in (0, 1):
        results[f"to_cpu_short_first_{dst}"] = gathered_to_cpu(rows(rank, SHORT_FIRST[rank]), SHORT_FIRST, dst, 1)
    results["broadcast_from_1"] = distributed.broadcast_object({"rank": rank}, src=1)

    calls = []

    def save(value, path):
        calls.append(("save", rank))
        Path(path).write_text(json.dumps(value))

    def load(path):
        calls.append(("load", rank))
        return json.loads(Path(path).read_text())

    def load_failing_on_rank_1(path):
        calls.append(("load", rank))
        if rank == 1:
            raise ValueError(f"{path} is damaged")
        return json.loads(Path(path).read_text())

    folder = output / "shared"
    results["through_file"] = distributed.broadcast_through_file({"rank": rank}, folder, save, load)
    dist.barrier()
    results["through_file_left"] = sorted(path.name for path in folder.iterdir())
    results["through_file_failing"] = distributed.broadcast_through_file(
        {"rank": rank}, output / "shared-2", save, load_failing_on_rank_1
    )
    (output / "a_file").write_text("")  # rank 0 cannot make its folder: every rank takes the broadcast copy
    dist.barrier()
    results["through_file_unwritable"] = distributed.broadcast_through_file(
        {"rank": rank}, output / "a_file" / "shared", save, load
    )
    results["calls"] = calls
    distributed.end_process_group()
    results["ended"] = dist.is_initialized()
    distributed.end_process_group()  # a no-op without a group
    torch.save(results, output / f"rank-{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
