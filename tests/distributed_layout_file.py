"""A label layout reaches every rank through a file, not pickled through a collective:
`torchrun --nproc_per_node 2 distributed_layout_file.py OUT` (from test_distributed.py) writes OUT/rank-R.pt.

Rank 0 holds a layout; `broadcast_through_file` gives it to every rank while `broadcast_object` records what it
carries. Then again with a reader that fails on rank 1 (hosts that share no file system): every rank takes the
broadcast copy. Each rank reports its layout's tensors, the types broadcast, and the files left in the folder.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from haste_hf import LabelLayout
from haste_hf.training import distributed
from haste_hf.training.distributed import broadcast_through_file, end_process_group


def layout_tensors(layout: LabelLayout) -> dict:
    return {
        "head_ids": layout.head_ids,
        "tail_order": layout.tail_order,
        "label_frequencies": layout.label_frequencies,
        "strategy": layout.strategy,
        "seed": layout.seed,
    }


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    broadcast, carried = distributed.broadcast_object, []

    def recording_broadcast(value, src=0, group=None):
        received = broadcast(value, src, group)
        carried.append(type(received).__name__)
        return received

    distributed.broadcast_object = recording_broadcast
    layout = None
    if rank == 0:
        frequencies = torch.randint(1, 50, (37,), generator=torch.Generator().manual_seed(0))
        layout = LabelLayout.from_frequencies(frequencies, 4, head_label_count=5, strategy="random", seed=3)
    folder = output / "run"
    shared = broadcast_through_file(layout, folder, LabelLayout.save, LabelLayout.load)
    dist.barrier()  # rank 0 has removed the file
    results = {"shared": layout_tensors(shared), "carried": list(carried), "left": sorted(os.listdir(folder))}

    def unreadable_on_rank_1(path):
        if rank == 1:
            raise OSError(2, "No such file or directory", path)
        return LabelLayout.load(path)

    carried.clear()
    folder = output / "run-2"  # rank 0 writes its next file while rank 1 may still be listing the first folder
    fallback = broadcast_through_file(layout, folder, LabelLayout.save, unreadable_on_rank_1)
    dist.barrier()
    results.update(fallback=layout_tensors(fallback), fallback_carried=list(carried), left_after=os.listdir(folder))
    torch.save(results, output / f"rank-{rank}.pt")
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
