"""Run by `torchrun --nproc_per_node 2` from test_distributed.py: HASTE training on gloo, CPU."""

import json
import sys

import torch
import torch.distributed as dist
from datasets import Dataset
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.data import XMCDataCollator
from haste_hf.trainer import HasteTrainer
from haste_hf.training_args import HasteTrainingArguments


def main(output_dir: str):
    from pathlib import Path

    output = Path(output_dir)
    torch.manual_seed(0)
    model = HasteForExtremeClassification(
        HasteConfig(encoder=tiny_encoder_config("bert"), label_count=40, head_label_count=4, group_size=4, fan_in=8)
    )
    args = HasteTrainingArguments(
        output_dir=str(output / "run"), per_device_train_batch_size=8, max_steps=12, learning_rate=3e-3,
        output_learning_rate=0.1, rewiring_interval=3, rewiring_fraction=0.25, rewiring_end_fraction=1.0, logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo", seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = HasteTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(planted_texts(40, 256)),
        data_collator=XMCDataCollator(tiny_tokenizer(output / f"tokenizer-{args.process_index}"), max_length=16),
    )  # fmt: skip
    trainer.train()
    rank = dist.get_rank()
    torch.save(
        {"supports": model.tail.supports, "tail": model.tail.weight.detach(), "head": model.head.weight.detach()},
        output / f"rank{rank}.pt",
    )
    summary = {
        "world_size": dist.get_world_size(),
        "broadcast_buffers": getattr(trainer.model_wrapped, "broadcast_buffers", None),
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "rewirings": [entry["step"] for entry in trainer.state.log_history if "rewired_pairs" in entry],
    }
    (output / f"rank{rank}.json").write_text(json.dumps(summary))
    # Tear gloo down before interpreter exit: left to process teardown, its threads can abort a rank
    # ("terminate called without an active exception"), seen once in CI with torch 2.13.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
