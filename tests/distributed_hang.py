"""A two-process run that hangs: rank 0 waits in a collective that rank 1 never enters.

`torchrun --nproc_per_node 2 distributed_hang.py OUT` (from test_checkpoint_ranks.py): each rank writes its process
id to OUT/pid-R, then rank 0 waits at a barrier and rank 1 sleeps. Only a kill ends it.
"""

import os
import sys
import time
from pathlib import Path

import torch.distributed as dist


def main(output: Path):
    dist.init_process_group("gloo")
    (output / f"pid-{dist.get_rank()}").write_text(str(os.getpid()))
    if dist.get_rank() == 0:
        dist.barrier()
    time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
