"""Each rank writes and reads only its share of the label names: `torchrun --nproc_per_node 3
distributed_label_names.py OUT` (from test_label_names.py) writes OUT/rank-R.pt.

A tiny sharded model whose names are a compact `LabelNameTable` (as the data gives them from
`COMPACT_LABEL_TEXTS_FROM` labels) is saved with `save_sharded_folder` and loaded back with `load_sharded_model`
while no name may be decoded, nor the table iterated or sliced into a list (what a list of every name would take).
Each rank reports its own names file's label range and bytes, and the loaded names.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file
from tiny_haste import make_tiny_model

from haste_hf.modeling import configuration_haste
from haste_hf.modeling.label_names import LabelNameTable, label_names_file
from haste_hf.training.distributed import end_process_group
from haste_hf.training.shard_checkpoints import load_sharded_model, save_sharded_folder
from haste_hf.training.sharded_output_layer import shard_output_layer_


LABELS = 41
NAMES = [f"label {label_id} é" if label_id % 7 else "" for label_id in range(LABELS)]  # some empty: LABEL_<id>


class NoNameDecoded:
    """Within the block, decoding a name, iterating a table or slicing it into a list raises."""

    def __enter__(self):
        self.saved = LabelNameTable.__getitem__, LabelNameTable.__iter__

        def refuse(*args):
            raise AssertionError("a name was decoded or the names were listed during the save or load")

        LabelNameTable.__getitem__ = LabelNameTable.__iter__ = refuse

    def __exit__(self, *exc):
        LabelNameTable.__getitem__, LabelNameTable.__iter__ = self.saved


def main(output: Path):
    configuration_haste.MAX_CONFIG_LABEL_NAMES = 10  # id2label a view of the names, as past 10,000 labels
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_tiny_model(LABELS, head_label_count=5, training=False)
    model.set_label_names(LabelNameTable.from_strings(NAMES))
    shard_output_layer_(model)
    with NoNameDecoded():
        save_sharded_folder(model, output / "model")
        loaded = load_sharded_model(output / "model")
    own = output / "model" / label_names_file(rank, world_size)
    with safe_open(own, framework="pt") as handle:
        first = int(handle.metadata()["first_label"])
    tensors = load_file(own)
    results = {
        "first": first,
        "count": tensors["offsets"].numel() - 1,
        "bytes": bytes(tensors["bytes"].numpy()),
        "loaded_is_table": isinstance(loaded.label_names, LabelNameTable),
        "loaded": list(loaded.label_names),
        "config_name": loaded.config.id2label[7],
    }
    torch.save(results, output / f"rank-{rank}.pt")
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
