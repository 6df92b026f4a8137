"""The host memory a rank of a sharded run adds to build its share of a model of many labels, as `haste-hf train`
builds it (`from_encoder_pretrained` with a `LabelLayout`, within `deferred_output_rows`, then sharded):
`torchrun --nproc_per_node 2 distributed_build_memory.py OUT` (from test_distributed.py) writes OUT/rank-R.pt.

The peak resident memory is reset (`/proc/self/clear_refs`) once the encoder and the layout exist: what the build
then adds above the resident memory before it, against the bytes of the share it keeps. Also the share's label ids,
for the test to compare with the layout's.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_encoders import tiny_encoder_config
from transformers import AutoModel

from haste_hf.labels.layout import LabelLayout
from haste_hf.modeling.initialization import deferred_output_rows
from haste_hf.modeling.modeling_haste import HasteForExtremeClassification
from haste_hf.training.sharded_output_layer import shard_output_layer_


# 12M labels: an [L] int64 array is 96 MB, the share a rank keeps (fan-in 1) 72 MB.
LABEL_COUNT, HEAD_LABELS, GROUP_SIZE = 12_000_000, 1000, 64


def memory(field: str) -> int:
    """`VmRSS` or `VmHWM` (the peak since the last reset) of this process, in bytes."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    order = torch.randperm(LABEL_COUNT, generator=torch.Generator().manual_seed(0))
    layout = LabelLayout(LABEL_COUNT, order[:HEAD_LABELS], order[HEAD_LABELS:], GROUP_SIZE, strategy="random")
    del order
    torch.manual_seed(0)
    encoder = AutoModel.from_config(tiny_encoder_config("bert"))
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM to the current resident memory
    before = memory("VmRSS")
    with deferred_output_rows():
        model = HasteForExtremeClassification.from_encoder_pretrained(encoder, layout=layout, fan_in=1)
    layer = shard_output_layer_(model)
    added = memory("VmHWM") - before
    kept = sum(tensor.nbytes for tensor in layer.state_dict().values() if tensor.data_ptr() and tensor.numel() > 4096)
    head, tail = layer.head_rows, layer.local_rows("tail.bias")
    expected = torch.cat([layout.output_labels()[slice(*head)], layout.output_labels()[HEAD_LABELS:][tail]])
    results = dict(
        added_peak=added, kept=kept, label_count=LABEL_COUNT, labels_equal=torch.equal(layer.output_labels, expected)
    )
    torch.save(results, output / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
