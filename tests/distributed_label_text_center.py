"""Rank 0 alone embeds the center of a sharded label-text initialisation: `torchrun --nproc_per_node 2
distributed_label_text_center.py OUT` (from test_distributed.py) writes OUT/rank-R.json: what
`init_share_from_label_texts_` returned on this rank, and whether its rows changed, when every label's text is blank;
and the error each rank raised when rank 0 fails to embed the center. Neither case may leave a rank waiting in the
broadcast of the center.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.labels import text_init
from haste_hf.modeling.initialization import deferred_output_rows
from haste_hf.training.sharded_output_layer import shard_output_layer_


MODEL = dict(label_count=40, head_label_count=6, seed=4, shuffle_labels=True, training=False)
OPTIONS = dict(batch_size=8, device="cpu", show_progress=False)


def sharded_model():
    with deferred_output_rows():
        model = make_tiny_model(**MODEL)
    shard_output_layer_(model)
    return model


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokenizer = tiny_tokenizer(output / f"tokenizer-{rank}")
    model = sharded_model()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    blank = ["", " ", "\t"] * 13 + [""]
    initialised = text_init.init_share_from_label_texts_(model, blank, tokenizer=tokenizer, **OPTIONS)
    unchanged = all(torch.equal(before[name], value) for name, value in model.state_dict().items())

    def failing(*args, **kwargs):
        raise ValueError("planted: the center's embedding failed")

    text_init._center = failing  # only rank 0 embeds the center
    try:
        text_init.init_share_from_label_texts_(sharded_model(), [f"w{i}" for i in range(40)], tokenizer=tokenizer)
        error = None
    except Exception as caught:
        error = f"{type(caught).__name__}: {caught}"
    results = dict(initialised=initialised, unchanged=unchanged, error=error)
    (output / f"rank-{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
