"""The final save of a sharded run links its last checkpoint's shards where they hold its final rows.

`torchrun --nproc_per_node 2 distributed_shard_links.py OUT` (from test_shard_checkpoints.py): a sharded run of 4
steps checkpoints its weights only (`save_only_model`) at steps 2 and 4, then `RunFolder.save_trained` saves the
model into the run's folder three times: as trained (each rank's shard is checkpoint-4's file, linked); with its
tail weights changed (written again); as trained, after checkpoint-4's shard files were replaced by ones of one byte
changed (written again, from the model). Each rank reports, for each save, whether its shard shares the
checkpoint file's inode and whether it holds the model's rows; rank 0 writes OUT/results.pt.
"""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from distributed_train import make_trainer

from haste_hf.modeling.output_shards import output_shard_file
from haste_hf.training.callbacks import unwrap_model
from haste_hf.training.distributed import end_process_group
from haste_hf.training.run_folder import RunFolder
from haste_hf.training.shard_checkpoints import share_tensors


def saved_shard(run: Path, model) -> dict:
    """Whether this rank's shard in `run` is checkpoint-4's file (same inode) and holds the model's rows."""
    from safetensors.torch import load_file

    name = output_shard_file(dist.get_rank(), dist.get_world_size())
    final, checkpoint = run / name, run / "checkpoint-4" / name
    saved = load_file(final)
    ours = share_tensors(model)
    return {
        "linked": os.stat(final).st_ino == os.stat(checkpoint).st_ino,
        "holds_the_model": set(saved) == set(ours) and all(torch.equal(saved[n], ours[n]) for n in ours),
    }


def flip_a_byte(path: Path) -> None:
    """Replaces `path` by a new file of its bytes with the last one changed (the file it was, linked elsewhere,
    stays as it was)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    changed = path.with_name(path.name + ".new")
    changed.write_bytes(bytes(data))
    os.replace(changed, path)


def main(output: Path):
    dist.init_process_group("gloo")
    run = output / "run"
    trainer = make_trainer(
        run, shard=True, save_strategy="steps", save_steps=2, max_steps=4, rewiring_interval=0, save_only_model=True
    )
    trainer.train()
    model, folder = unwrap_model(trainer.model), RunFolder(run, overwrite=True)
    results = {}
    folder.save_trained(trainer, None, lambda staging: None)
    results["as_trained"] = saved_shard(run, model)
    weight = model.output_layer.tail.weight
    trained = weight.detach().clone()
    with torch.no_grad():
        weight.add_(1.0)
    folder.save_trained(trainer, None, lambda staging: None)
    results["weights_changed"] = saved_shard(run, model)
    with torch.no_grad():
        weight.copy_(trained)
    flip_a_byte(run / "checkpoint-4" / output_shard_file(dist.get_rank(), dist.get_world_size()))
    folder.save_trained(trainer, None, lambda staging: None)
    results["checkpoint_changed"] = saved_shard(run, model)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, results)
    if dist.get_rank() == 0:
        torch.save(everyone, output / "results.pt")
    del trainer
    end_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
