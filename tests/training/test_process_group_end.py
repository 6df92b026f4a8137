"""`end_process_group` ends the group it is asked to end: past it, no gloo thread runs in the process (left running,
the interpreter's teardown frees the group and the rank can abort or hang after its work)."""

import sys
import textwrap

from processes import child_environment, run


RANK = textwrap.dedent(
    """
    import os
    import sys

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from haste_hf.training.distributed import end_process_group


    def threads():
        return [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]


    def train():
        DistributedDataParallel(torch.nn.Linear(4, 4))


    assert "torch.distributed.nn.functional" not in sys.modules
    dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
    train()  # DDP's constructor imports torch.distributed.nn (through torch._dynamo) once the group exists
    assert "torch.distributed.nn.functional" in sys.modules
    print("before", *threads(), flush=True)
    end_process_group()
    print("after", *threads(), flush=True)
    """
)


def test_no_gloo_thread_outlives_the_group_after_a_ddp_wrapper(tmp_path):
    """DDP's constructor imports `torch.distributed.nn`, whose collectives bind `group.WORLD` as a default when first
    imported: here the live group, which they held past `destroy_process_group` with its gloo threads running."""
    result = run(
        [sys.executable, "-c", RANK, str(tmp_path / "store")], timeout=300, env=child_environment(), cwd=tmp_path
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert "gloo" in lines["before"]  # the threads this test looks for exist while the group does
    assert "gloo" not in lines["after"], lines["after"]
