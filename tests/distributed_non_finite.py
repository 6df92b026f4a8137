"""A NaN gradient on one rank only: every rank stops, or skips, at the same step.

`torchrun --nproc_per_node 2 distributed_non_finite.py OUT ACTION` (from test_distributed.py): rank 1 makes
its share of the sharded tail's gradient NaN at step 3; each rank writes OUT/rank-R.json with what it saw.
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from distributed_train import make_trainer, world
from transformers import TrainerCallback

from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.distributed import end_process_group


# A rank left waiting in a collective fails within the test's 180 s instead of after gloo's 30 minutes.
COLLECTIVE_TIMEOUT = timedelta(seconds=90)


class PoisonRankOne(TrainerCallback):
    """Before the optimizer steps (and before the guard, added earlier, looks), on rank 1 at step 3."""

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.step = state.global_step + 1

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if world()[0] == 1 and self.step == 3:
            unwrap_model(model).output_layer.tail.weight.grad.view(-1)[0] = float("nan")


def run(output: Path, action: str) -> dict:
    """What this rank saw: the error raised (None), the step reached and the steps skipped."""
    trainer = make_trainer(output / "run", shard=True, max_steps=5, on_non_finite=action, rewiring_interval=0)
    trainer.callback_handler.callbacks.insert(0, PoisonRankOne())  # runs before the guard
    outcome = {"error": None}
    try:
        trainer.train()
    except FloatingPointError as error:
        outcome["error"] = str(error)
    outcome.update(step=trainer.state.global_step, skipped=trainer.non_finite_guard.skipped_steps)
    return outcome


def main(output: Path, action: str):
    dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
    outcome = run(output, action)
    (output / f"rank-{world()[0]}.json").write_text(json.dumps(outcome))
    end_process_group()  # the trainer gone first: see its docstring


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
