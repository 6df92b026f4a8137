"""A sharded run saves, checkpoints and resumes whichever ranks the Trainer calls `_save` on.

`torchrun --nproc_per_node 2 distributed_save_ranks.py OUT PATTERN` (from test_checkpoint_ranks.py): the
Trainer's `save_model` is replaced by the one of a transformers release, `main_only` (5.17: `_save` on the main
process only) or `every_rank` (5.24: `_save` on every rank, which returns on those that do not write); then a
sharded run of 8 steps checkpoints at steps 4 and 8, saves its model, and is resumed from step 4. Rank 0 writes
OUT/results.pt. A rank left alone in a collective hangs: the test's timeout ends it.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from distributed_train import full_state, make_trainer
from transformers import Trainer

from haste_hf.training.distributed import end_process_group


def save_model_on_main_only(self, output_dir=None, _internal_call=False):
    """transformers 5.17's `Trainer.save_model` without FSDP, DeepSpeed or XLA."""
    if self.args.should_save:
        self._save(output_dir if output_dir is not None else self.args.output_dir)


def save_model_on_every_rank(self, output_dir=None, _internal_call=False):
    """transformers 5.24's."""
    self._save(output_dir if output_dir is not None else self.args.output_dir)


PATTERNS = {"main_only": save_model_on_main_only, "every_rank": save_model_on_every_rank}


def run(output: Path) -> dict:
    """The uninterrupted sharded run's state and the state of its resumption from checkpoint 4."""
    checkpoints = dict(save_strategy="steps", save_steps=4, max_steps=8, rewiring_interval=0)
    trainer = make_trainer(output / "run", shard=True, **checkpoints)
    trainer.train()
    trainer.save_model(str(output / "model"))
    uninterrupted = full_state(trainer.model)
    resumed = make_trainer(output / "run", shard=True, **checkpoints)
    resumed.train(resume_from_checkpoint=str(output / "run" / "checkpoint-4"))
    return {"uninterrupted": uninterrupted, "resumed": full_state(resumed.model)}


def main(output: Path, pattern: str):
    dist.init_process_group("gloo")
    Trainer.save_model = PATTERNS[pattern]
    results = run(output)
    if dist.get_rank() == 0:
        torch.save(results, output / "results.pt")
    end_process_group()  # the trainers gone first: see its docstring


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
