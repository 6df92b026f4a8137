"""The sharded row gather and its backward with unequal batch shares: each rank writes OUT/rank-R.pt.

`torchrun --nproc_per_node 2 distributed_gather.py OUT` (from test_distributed.py). For each split of 16 rows
in `COUNTS`, rank r holds `rows(r, counts)` and weighs the gathered rows by `weights(r, counts)`; the test
checks the gathered rows and the gradients against their definitions.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from haste_hf.training.distributed import gather_rows_to_cpu, gather_rows_with_gradient


COUNTS = ([5, 11], [11, 5], [1, 15], [8, 8])
WIDTH = 3
GRAD_SCALE = 0.5


def rows(rank: int, counts: list[int]) -> torch.Tensor:
    return torch.randn(counts[rank], WIDTH, generator=torch.Generator().manual_seed(100 * rank + counts[0]))


def weights(rank: int, counts: list[int]) -> torch.Tensor:
    return torch.randn(sum(counts), WIDTH, generator=torch.Generator().manual_seed(1000 + 100 * rank + counts[0]))


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for counts in COUNTS:
        x = rows(rank, counts).requires_grad_()
        gathered = gather_rows_with_gradient(x, counts, grad_scale=GRAD_SCALE)
        (gathered * weights(rank, counts)).sum().backward()
        results[tuple(counts)] = {
            "gathered": gathered.detach(),
            "grad": x.grad,
            "to_cpu": gather_rows_to_cpu(x.detach(), counts),
        }
    torch.save(results, output / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
