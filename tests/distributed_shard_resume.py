"""A sharded checkpoint of 2 ranks resumed on 3: each rank reads only the rows it owns, and starts from the saved
weights and momentum; a save that fails on one rank fails on every rank and leaves the folder as it was.

`torchrun --nproc_per_node 2 distributed_shard_resume.py OUT save`: a sharded run of 4 steps checkpoints at step 4
and saves its model; then a save whose rank 1 cannot write its shard. Rank 0 writes OUT/saved.pt (the whole state and
momentum at step 4), every rank OUT/failed-RANK.json (the error it raised).
`torchrun --nproc_per_node 3 distributed_shard_resume.py OUT load`: resumes OUT/run/checkpoint-4 for 2 more steps;
rank 0 writes OUT/loaded.pt (the state and momentum it started from, the rows each rank read, the steps it ran).
The test resumes the same checkpoint in its own process (world size 1) with the same functions.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from distributed_train import end_process_group, full_state, make_trainer, world
from transformers import TrainerCallback

from haste_hf.modeling.output_shards import ROW_SHARDED_TENSORS, OutputShards
from haste_hf.training import shard_checkpoints
from haste_hf.training.callbacks import unwrap_model
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


class StartingPoint(TrainerCallback):
    """Keeps the state and momentum the resumed run starts from (the checkpoint's, once loaded)."""

    def __init__(self):
        self.trainer = self.start = None

    def on_train_begin(self, args, state, control, **kwargs):
        state = full_state(self.trainer.model)  # the live tensors where not gathered: copied before they train on
        self.start = {"state": state and {name: value.clone() for name, value in state.items()}}
        self.start["momentum"] = output_momentum(self.trainer)


def resume(output: Path, run_dir: Path) -> dict:
    """Resumes the checkpoint of `save` for 2 more steps, recording the rows this rank read of the shards."""
    reads, read_rows = [], OutputShards.read_rows

    def recorded(self, name, start, stop):
        reads.append((name, start, stop))
        return read_rows(self, name, start, stop)

    OutputShards.read_rows = recorded
    starting = StartingPoint()
    trainer = make_trainer(run_dir, shard=world()[1] > 1, **{**RUN, "max_steps": 6, "save_strategy": "no"})
    starting.trainer = trainer
    trainer.add_callback(starting)
    trainer.train(resume_from_checkpoint=str(output / "run" / "checkpoint-4"))
    OutputShards.read_rows = read_rows
    layer = unwrap_model(trainer.model).output_layer
    owned = {"head_rows": layer.head_rows, "tail_groups": layer.tail_groups}
    every = [None] * world()[1] if world()[1] > 1 else None
    if every is not None:
        dist.all_gather_object(every, (owned, reads))
    return {**starting.start, "reads": every or [(owned, reads)], "step": trainer.state.global_step}


def save(output: Path) -> None:
    trainer = make_trainer(output / "run", shard=True, **RUN)
    trainer.train()
    saved = {"state": full_state(trainer.model), "momentum": output_momentum(trainer)}
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
        loaded = resume(output, output / "run3")
        if dist.get_rank() == 0:
            torch.save(loaded, output / "loaded.pt")
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
