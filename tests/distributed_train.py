"""HASTE training on several processes (gloo, CPU), and the same runs on one process.

`torchrun --nproc_per_node 2 distributed_train.py OUT REPO_ID` (from test_distributed.py) runs, on 2 ranks:
one step's loss and gradients, a replicated run, a sharded run with checkpoints, its push to REPO_ID on
the Hub of the environment, its resumption, and sharded evaluation and prediction; rank 0 writes what
they gave to OUT/results.pt. The test calls the same
functions in its own process (world size 1) for the references.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer

from haste_hf.data import XMCDataCollator
from haste_hf.metrics import make_compute_metrics
from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.distributed import end_process_group
from haste_hf.training.sharded_output_layer import ignore_shards_in_ddp, shard_output_layer_, sharded_output_layer
from haste_hf.training.trainer import HasteTrainer, split_parameters


LABELS = 40
GLOBAL_BATCH = 16
STEPS = 12
EVAL_TEXTS = 24  # whole batches on every rank: no repeated examples (whose losses the Trainer only approximates)
PREDICT_TEXTS = 23  # unequal shares of the ranks


def make_model(tail_projection_dim=16):
    """40 labels: head 5 (3 + 2 rows on 2 ranks), tail 35 in 9 groups of 4 (5 + 4 groups, one padding slot)."""
    encoder = tiny_encoder_config("bert")
    encoder.hidden_dropout_prob = encoder.attention_probs_dropout_prob = 0.0  # one process draws other masks
    return make_tiny_model(LABELS, head_label_count=5, encoder=encoder, tail_projection_dim=tail_projection_dim)


def world():
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def collator(output: Path):
    return XMCDataCollator(tiny_tokenizer(output / f"tokenizer-{world()[0]}"), max_length=16)


def make_trainer(output: Path, shard: bool, model=None, **overrides) -> HasteTrainer:
    world_size = world()[1]
    training = dict(
        per_device_train_batch_size=GLOBAL_BATCH // world_size,
        per_device_eval_batch_size=4,
        max_steps=STEPS,
        learning_rate=3e-3,
        output_learning_rate=0.1,
        rewiring_interval=3,
        rewiring_fraction=0.25,
        rewiring_end_fraction=1.0,
        max_grad_norm=1.0,
        output_max_grad_norm=2.0,
        logging_steps=1,
        save_strategy="no",
        ddp_backend="gloo" if world_size > 1 else None,
        shard_output_layer=shard,
    )
    return make_tiny_trainer(
        output,
        None,
        Dataset.from_list(planted_texts(LABELS, 256)),
        make_model() if model is None else model,
        eval_dataset=Dataset.from_list(planted_texts(LABELS, EVAL_TEXTS, seed=1)),
        data_collator=collator(output),
        compute_metrics=make_compute_metrics(ks=(1, 3)),
        **{**training, **overrides},
    )


def full_state(model) -> dict:
    """The whole model's state on rank 0 (gathered where the output layer is sharded)."""
    model = unwrap_model(model)
    if sharded_output_layer(model) is not None:
        return model.output_layer.full_state_dict(model)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def run_summary(trainer) -> dict:
    history = trainer.state.log_history
    return {
        "losses": [entry["loss"] for entry in history if "loss" in entry],
        "rewirings": [(entry["step"], entry["rewired_pairs"]) for entry in history if "rewired_pairs" in entry],
        "state": full_state(trainer.model),
        "broadcast_buffers": getattr(trainer.model_wrapped, "broadcast_buffers", None),
    }


def one_step_gradients(output: Path, tail_projection_dim, dense_labels=False) -> dict:
    """Loss and gradients of one global batch, this rank holding its examples (and its share of labels);
    labels as padded ids, or as a dense multi-hot."""
    rank, world_size = world()
    model = make_model(tail_projection_dim)
    wrapped = model
    if world_size > 1:
        shard_output_layer_(model)
        ignore_shards_in_ddp(model)
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    rows = planted_texts(LABELS, GLOBAL_BATCH, seed=2)
    per_rank = GLOBAL_BATCH // world_size
    batch = collator(output)(rows[rank * per_rank : (rank + 1) * per_rank])
    if dense_labels:
        ids = batch["labels"]  # padding goes to an extra column, then dropped
        multi_hot = torch.zeros(ids.shape[0], LABELS + 1).scatter_(1, torch.where(ids == -100, LABELS, ids), 1.0)
        batch["labels"] = multi_hot[:, :LABELS]
    loss = wrapped(**batch).loss
    loss.backward()
    loss = loss.detach().clone()
    if world_size > 1:  # as the Trainer logs it: the mean of the ranks' values
        dist.all_reduce(loss)
        loss /= world_size
    encoder_side, _ = split_parameters(model)
    gradients = {name: param.grad.clone() for name, param in encoder_side}
    output_layer = {
        name: param.grad
        for name, param in model.output_layer.named_parameters()
        if name.split(".")[0] in ("head", "tail")
    }
    if sharded_output_layer(model) is not None:
        output_layer = model.output_layer.gather_full(output_layer)
    return {"loss": loss.item(), "encoder": gradients, "output_layer": output_layer}


def evaluate_and_predict(trainer) -> dict:
    """Trainer evaluation metrics and `predict_topk` of the evaluation texts, split over the ranks."""
    rank, world_size = world()
    metrics = trainer.evaluate()
    texts = planted_texts(LABELS, PREDICT_TEXTS, seed=3)
    share = [len(range(r, PREDICT_TEXTS, world_size)) for r in range(world_size)]
    start = sum(share[:rank])
    batch = trainer.data_collator(texts[start : start + share[rank]])
    model = unwrap_model(trainer.model).eval()
    top = model.predict_topk(batch["input_ids"], batch["attention_mask"], k=3)
    parts = [top] if world_size == 1 else [None] * world_size
    if world_size > 1:
        dist.all_gather_object(parts, (top.label_ids, top.scores))
        parts = [type(top)(label_ids=ids, scores=scores) for ids, scores in parts]
    return {
        "metrics": {name: value for name, value in metrics.items() if name.startswith("eval_P@")},
        "eval_loss": metrics["eval_loss"],
        "top_ids": torch.cat([part.label_ids for part in parts]),
        "top_scores": torch.cat([part.scores for part in parts]),
    }


def main(output: Path, repo_id: str):
    dist.init_process_group("gloo")
    results = run(output, repo_id)
    if dist.get_rank() == 0:
        torch.save(results, output / "results.pt")
    end_process_group()


def run(output: Path, repo_id: str) -> dict:
    """What the test compares, from every part of the two-process runs (the trainers end with this function)."""
    results = {
        "gradients": one_step_gradients(output, tail_projection_dim=None),
        "gradients_projected": one_step_gradients(output, tail_projection_dim=16, dense_labels=True),
    }
    replicated = make_trainer(output / "replicated", shard=False)
    streams = [None] * dist.get_world_size()
    dist.all_gather_object(streams, torch.rand(4))
    results["dropout_streams"] = streams
    replicated.train()
    results["replicated"] = run_summary(replicated)
    sharded = make_trainer(
        output / "sharded", shard=True, save_strategy="steps", save_steps=4, save_total_limit=2, hub_model_id=repo_id
    )
    sharded.train()
    results["sharded"] = run_summary(sharded)
    results["sharded_checkpoints"] = sorted(path.name for path in (output / "sharded").glob("checkpoint-*"))
    results["sharded_prediction"] = evaluate_and_predict(sharded)
    sharded.save_model(str(output / "sharded-model"))
    sharded.push_to_hub(commit_message="Sharded run")  # to the test Hub of the environment
    resumed = make_trainer(output / "sharded", shard=True, save_strategy="steps", save_steps=4, save_total_limit=2)
    resumed.train(resume_from_checkpoint=str(output / "sharded" / "checkpoint-8"))
    results["resumed"] = run_summary(resumed)
    # Every rank sends its replicated state: the test checks that the replicas agree.
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, {name: value for name, value in unwrap_model(replicated.model).state_dict().items()})
    results["replica_states"] = states
    return results


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
