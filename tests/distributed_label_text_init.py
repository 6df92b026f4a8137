"""Each rank starts its share's rows from its own labels' texts: `torchrun --nproc_per_node 2
distributed_label_text_init.py OUT` (from test_distributed.py) writes OUT/rank-R.pt: the share's state after
`init_share_from_label_texts_`, the whole model's after `init_from_label_texts_` in this process, the share's rows,
and how many texts each rank embedded.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.labels import text_init
from haste_hf.modeling.initialization import deferred_output_rows
from haste_hf.training.sharded_output_layer import shard_output_layer_


# 90 labels, head 13, G 4 (two ranks: head rows 7 + 6, tail groups 10 + 10); label 5's text is blank.
MODEL = dict(label_count=90, head_label_count=13, seed=3, shuffle_labels=True, training=False)
TEXTS = [" " if label == 5 else f"{WORDS[label % 90]} {WORDS[(7 * label) % 90]}" for label in range(90)]
OPTIONS = dict(batch_size=8, device="cpu", show_progress=False)


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokenizer = tiny_tokenizer(output / f"tokenizer-{rank}")
    whole = make_tiny_model(**MODEL)
    text_init.init_from_label_texts_(whole, TEXTS, tokenizer=tokenizer, **OPTIONS)
    embedded = []
    original = text_init.label_text_embeddings

    def counted(encoder, texts, **options):  # the texts this rank embeds
        embedded.extend(texts)
        return original(encoder, texts, **options)

    text_init.label_text_embeddings = counted
    with deferred_output_rows():
        model = make_tiny_model(**MODEL)
    shard = shard_output_layer_(model)
    initialised = text_init.init_share_from_label_texts_(model, TEXTS, tokenizer=tokenizer, **OPTIONS)
    results = dict(
        share=model.state_dict(),
        whole=whole.state_dict(),
        rows=(shard.head_rows, shard.tail_groups),
        embedded=len(embedded),
        initialised=initialised,
    )
    torch.save(results, output / f"rank-{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
