"""A sharded checkpoint of 2 ranks resumed on 3: each rank reads only the rows it owns, and starts from the saved
weights and momentum; a save that fails on one rank fails on every rank and leaves the folder as it was.

`torchrun --nproc_per_node 2 distributed_shard_resume.py OUT save`: a sharded run of 4 steps checkpoints at step 4
and saves its model; then a save whose rank 1 cannot write its shard. Rank 0 writes OUT/saved.pt (the whole state and
momentum at step 4), every rank OUT/failed-RANK.json (the error it raised).
`torchrun --nproc_per_node 3 distributed_shard_resume.py OUT load`: resumes OUT/run/checkpoint-4 for 2 more steps,
then OUT/one/checkpoint-6 (a one-process checkpoint: one weights file, the whole momentum in optimizer.pt) for 2;
rank 0 writes OUT/loaded.pt (for each: the state and momentum it started from, the rows each rank read, the steps
it ran). The test resumes checkpoint 4 in its own process (world size 1, saving checkpoint 6) with `resume`.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from distributed_train import full_state, make_trainer, world
from transformers import TrainerCallback

from haste_hf.modeling.output_shards import ROW_SHARDED_TENSORS, OutputShards
from haste_hf.training import shard_checkpoints
from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.distributed import end_process_group
from haste_hf.training.optimization import unwrap_haste_optimizer
from haste_hf.training.sharded_output_layer import sharded_output_layer


RUN = dict(save_strategy="steps", save_steps=4, max_steps=4, rewiring_interval=3)


def output_momentum(trainer) -> dict:
    """The output layer's momentum by parameter name, whole (gathered on rank 0 where sharded)."""
    model = unwrap_model(trainer.model)
    optimizer = unwrap_haste_optimizer(trainer.optimizer).output_optimizer
    momentum = {
        "output_layer." + name: optimizer.state[param]["momentum_buffer"].clone()
        for name, param in model.output_layer.named_parameters()
        if name in ROW_SHARDED_TENSORS and param in optimizer.state
    }
    return model.output_layer.gather_full(momentum, "output_layer.") if sharded_output_layer(model) else momentum


def snapshot(trainer) -> dict:
    """The whole state (on rank 0) and momentum of `trainer`'s model, copied."""
    state = full_state(trainer.model)  # the live tensors where not gathered: copied before they train on
    return {
        "state": state and {name: value.clone() for name, value in state.items()},
        "momentum": output_momentum(trainer),
    }


class StartingPoint(TrainerCallback):
    """Keeps the state and momentum the resumed run starts from (the checkpoint's, once loaded)."""

    def __init__(self):
        self.trainer = self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = snapshot(self.trainer)


def resume(run_dir: Path, checkpoint: Path, steps: int, save: bool = False) -> dict:
    """Resumes `checkpoint` up to step `steps` (with `save`, checkpointing there), recording the rows this rank read
    of the shards; the state and momentum it started from and ended with."""
    reads, read_rows = [], OutputShards.read_rows

    def recorded(self, name, start, stop):
        reads.append((name, start, stop))
        return read_rows(self, name, start, stop)

    OutputShards.read_rows = recorded
    starting = StartingPoint()
    saving = {"save_strategy": "steps" if save else "no", "save_steps": steps}
    trainer = make_trainer(run_dir, shard=world()[1] > 1, **{**RUN, "max_steps": steps, **saving})
    starting.trainer = trainer
    trainer.add_callback(starting)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    OutputShards.read_rows = read_rows
    layer = unwrap_model(trainer.model).output_layer
    owned = {"head_rows": layer.head_rows, "tail_groups": layer.tail_groups}
    every = [None] * world()[1] if world()[1] > 1 else None
    if every is not None:
        dist.all_gather_object(every, (owned, reads))
    return {
        "start": starting.start,
        "end": snapshot(trainer),
        "reads": every or [(owned, reads)],
        "step": trainer.state.global_step,
    }


def save(output: Path) -> None:
    trainer = make_trainer(output / "run", shard=True, **RUN)
    trainer.train()
    saved = snapshot(trainer)
    trainer.save_model(str(output / "model"))
    if dist.get_rank() == 1:  # its shard cannot be written
        shard_checkpoints.write_safetensors = lambda *args, **kwargs: (_ for _ in ()).throw(OSError("disk full"))
    try:
        trainer.save_model(str(output / "model"))
        error = None
    except (OSError, ValueError) as raised:
        error = f"{type(raised).__name__}: {raised}"
    (output / f"failed-{dist.get_rank()}.json").write_text(json.dumps(error))
    if dist.get_rank() == 0:
        torch.save(saved, output / "saved.pt")


def main(output: Path, stage: str):
    dist.init_process_group("gloo")
    if stage == "save":
        save(output)
    else:
        loaded = {
            "sharded": resume(output / "run3", output / "run" / "checkpoint-4", 6),
            "one file": resume(output / "run3-one-file", output / "one" / "checkpoint-6", 8),
        }
        if dist.get_rank() == 0:
            torch.save(loaded, output / "loaded.pt")
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
