"""A sharded output layer with fewer head rows and tail groups than ranks: some ranks hold an empty share.

`torchrun --nproc_per_node N distributed_empty_shares.py OUT SCALE` (from test_faults_runs.py) trains, checkpoints,
resumes, evaluates and predicts (one text too: empty shares of the batch as well) with 6 labels: a head of 2 rows and
a tail of one group of 4, so that on 3 ranks rank 1 holds a head row and no group and rank 2 nothing at all; the tail
at SCALE times the head's SGD rate (`output_tail_lr_scale`; 1: one parameter group, else two). Rank 0 writes what
the run gave to OUT/results.pt; the test runs the same in one process for the reference.

The model is float64. In float32, the ranks' other order of summation leaves a last-bit difference in each gradient,
and AdamW turns it into a weight difference past any tolerance where an element's first non-zero gradient is near
its epsilon (1e-8): the update is about lr * g / (|g| + eps), so g = 6.8e-8 known to 0.4% moved a word embedding by
1.2e-6 (tail scale 2, 3 ranks). In float64 the same runs agree to 4e-15 on the encoder and 2e-9 on the output layer
(whose SGD updates in float32): what is compared is the sharding, not the rounding.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from datasets import Dataset
from distributed_train import collator, run_summary, world
from tiny_encoders import planted_texts, tiny_encoder_config
from tiny_haste import make_tiny_model, make_tiny_trainer

from haste_hf.metrics import make_compute_metrics
from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.distributed import end_process_group
from haste_hf.training.trainer import HasteTrainer


LABELS = 6
GLOBAL_BATCH = 12
TEXTS = 7  # unequal shares of the ranks


def make_model():
    encoder = tiny_encoder_config("bert")
    encoder.hidden_dropout_prob = encoder.attention_probs_dropout_prob = 0.0  # one process draws other masks
    model = make_tiny_model(LABELS, head_label_count=2, group_size=4, fan_in=8, encoder=encoder)
    return model.double()  # see the module's docstring


def make_trainer(output: Path, tail_lr_scale: float, **overrides) -> HasteTrainer:
    world_size = world()[1]
    training = dict(
        output_tail_lr_scale=tail_lr_scale,
        per_device_train_batch_size=GLOBAL_BATCH // world_size,
        per_device_eval_batch_size=2,
        max_steps=6,
        learning_rate=3e-3,
        output_learning_rate=0.1,
        output_momentum=0.9,
        rewiring_interval=2,
        rewiring_fraction=0.25,
        rewiring_end_fraction=1.0,
        output_max_grad_norm=2.0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=3,
        ddp_backend="gloo" if world_size > 1 else None,
    )
    return make_tiny_trainer(
        output,
        None,
        Dataset.from_list(planted_texts(LABELS, 96)),
        make_model(),
        eval_dataset=Dataset.from_list(planted_texts(LABELS, TEXTS, seed=1)),
        data_collator=collator(output),
        compute_metrics=make_compute_metrics(ks=(1, 3)),
        **{**training, **overrides},
    )


def predict(trainer, count: int) -> dict:
    """`predict_topk` of the first `count` evaluation texts, each rank predicting its contiguous share (empty on
    the last ranks when there are fewer texts than ranks)."""
    from haste_hf.training.distributed import balanced_ranges

    rank, world_size = world()
    texts = planted_texts(LABELS, TEXTS, seed=1)[:count]
    start, stop = balanced_ranges(count, world_size)[rank]
    batch = trainer.data_collator(texts[start:stop] or texts[:1])
    batch = {name: tensor[: stop - start] for name, tensor in batch.items()}
    top = unwrap_model(trainer.model).eval().predict_topk(batch["input_ids"], batch["attention_mask"], k=3)
    parts = [(top.label_ids, top.scores)]
    if world_size > 1:
        parts = [None] * world_size
        dist.all_gather_object(parts, (top.label_ids, top.scores))
    return {"top_ids": torch.cat([ids for ids, _ in parts]), "top_scores": torch.cat([scores for _, scores in parts])}


def run(output: Path, tail_lr_scale: float) -> dict:
    """Train 6 steps with checkpoints at 3 and 6, resume the second half from checkpoint 3, evaluate, predict."""
    trainer = make_trainer(output, tail_lr_scale)
    trainer.train()
    results = {"run": run_summary(trainer)}
    resumed = make_trainer(output, tail_lr_scale)
    resumed.train(resume_from_checkpoint=str(output / "checkpoint-3"))
    results["resumed"] = run_summary(resumed)
    # The metrics, not the loss: the Trainer repeats examples to fill the ranks' last batches, and averages their losses.
    results["metrics"] = {name: value for name, value in resumed.evaluate().items() if name.startswith("eval_P@")}
    results["predictions"] = [predict(resumed, count) for count in (1, TEXTS)]
    return results


def main(output: Path, tail_lr_scale: float):
    dist.init_process_group("gloo")
    results = run(output / "run", tail_lr_scale)
    if dist.get_rank() == 0:
        torch.save(results, output / "results.pt")
    end_process_group()  # the trainers gone first: see its docstring


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
