"""`predict_top_k` on 2 gloo processes, chunks of 4 texts cut into batches of a token budget: rank 0's short texts
go one batch a chunk, rank 1's long ones two, and rank 1 has a chunk fewer; both ranks call the model as often (the
calls a sharded output layer makes together), with empty batches where they have none left. `torchrun
--nproc_per_node 2 distributed_predict_chunks.py OUT` (from test_evaluation.py) writes OUT/rank-R.pt."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.evaluation import predict_top_k
from haste_hf.labels import embeddings


SHORT = ["w1", "w2 w3", "w4", "w5 w6", "w7"]  # rank 0's share (5 of 9 texts): a chunk of 4, then of 1
LONG = ["w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19"] * 4  # rank 1's share: one chunk of 4, 2 batches
TEXTS = SHORT + LONG


def main(output: Path):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    embeddings.CHUNK_TEXTS, embeddings.CHUNK_RAMP = 4, 0
    tokenizer = tiny_tokenizer(output / f"tokenizer-{rank}")
    model = make_tiny_model(training=False)
    calls = []
    predict_topk = model.predict_topk

    def recording(input_ids, attention_mask, **kwargs):
        calls.append(input_ids.shape[0])
        return predict_topk(input_ids, attention_mask, **kwargs)

    model.predict_topk = recording
    # A budget of 2 x 16 = 32 padded tokens: 4 short texts in one batch, the long ones (14 tokens) two at a time.
    ids, scores = predict_top_k(model, tokenizer, TEXTS, 3, batch_size=2, max_length=16)
    torch.save({"ids": ids, "scores": scores, "calls": calls}, output / f"rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
