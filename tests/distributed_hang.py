"""A two-process run that hangs: rank 0 waits in a collective that rank 1 never enters.

`torchrun --nproc_per_node 2 distributed_hang.py OUT` (from test_checkpoint_ranks.py): each rank writes its process
id to OUT/pid-R, then joins the group; rank 0 waits at a barrier and rank 1 sleeps. Only a kill ends it.
"""

import os
import sys
import time
from pathlib import Path


def main(output: Path):
    # First, before torch loads: on a loaded 2-core machine the ranks can take most of the test's timeout to import
    # torch, and the test reads these files whatever the ranks were doing when they were killed.
    (output / f"pid-{os.environ['RANK']}").write_text(str(os.getpid()))
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        dist.barrier()
    time.sleep(3600)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
