"""Each rank builds only its share of the output layer: `torchrun --nproc_per_node 2 distributed_shard_build.py OUT`
(from test_distributed.py) writes OUT/rank-R.pt.

1. A model of `LARGE` labels built within `deferred_output_rows` and sharded: the peak resident memory it adds
   (`ru_maxrss`, measured before anything else large is built), against the bytes of the whole tail.
2. A tiny model (blocks of 5 rows, so shares cut blocks) built so and sharded, and the same model built whole on
   each rank: the share's rows, and everything else, for the test to compare; the positions of every label id
   through the share (its own labels' alone) and through the whole model.
"""

import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_haste import make_tiny_model

from haste_hf.modeling import initialization
from haste_hf.modeling.initialization import deferred_output_rows
from haste_hf.training.sharded_output_layer import shard_output_layer_


# 100,000 tail groups of 16 labels x 32 features: 205 MB of fp32 tail weights whole, half of it a rank (and 13 MB of
# label positions, whole on every rank).
LARGE = dict(label_count=1_600_000, head_label_count=0, group_size=16, fan_in=32)
SMALL = dict(label_count=90, head_label_count=13, seed=3, tail_bias=True)


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    before = peak_bytes()
    with deferred_output_rows():
        model = make_tiny_model(**LARGE)
    layer = shard_output_layer_(model)
    added = peak_bytes() - before
    results = {"added_peak": added, "local_tail_bytes": layer.tail.weight.numel() * 4, "groups": layer.tail_groups}
    del model, layer

    initialization.INITIAL_BLOCK_ROWS = 5
    with deferred_output_rows():
        model = make_tiny_model(**SMALL)
    shard = shard_output_layer_(model)
    whole = make_tiny_model(**SMALL)
    results.update(share=model.state_dict(), whole=whole.state_dict(), rows=(shard.head_rows, shard.tail_groups))
    # Label ids -> positions from the share's own ids (no [L] map on a rank): -1 for the labels of other ranks.
    every_label = torch.arange(SMALL["label_count"]).view(3, -1)
    results.update(positions=shard.positive_positions(every_label), whole_positions=whole.output_layer.label_positions)
    try:
        _ = shard.label_positions
    except ValueError as error:
        results["label_positions_refused"] = str(error)
    torch.save(results, output / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
