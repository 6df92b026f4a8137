# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The output folder of a training run, owned in one place: checked before anything loads, held by a lock for the
whole run (`run_lock`), cleared of another run's checkpoints when it is overwritten, and finalised by switching the
trained model and its results into it at once (`saving.save_folder_atomically`), then pushed to the Hub if asked."""

import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from pathlib import Path

from ..modeling.saving import (
    checkpoint_folders,
    save_folder_atomically,
    save_trained_folder,
)
from .run_lock import output_dir_lock


MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")


def check_writable_folder(folder: Path) -> None:
    """Raises a `ValueError` naming `folder` when a run could not write into it: it is a file, a file stands where
    one of its parents should be, or the folder (or the nearest existing parent that would hold it) refuses new
    files. Tried by writing, since permissions do not tell (root, read-only mounts, network file systems)."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        where = "is a file" if existing == folder else f"cannot be created: {existing} is a file"
        raise ValueError(f"{folder} {where}; give a folder path.")
    try:
        handle, probe = tempfile.mkstemp(prefix=".haste-write-test-", dir=existing)
    except OSError as error:
        shown = folder if existing == folder else f"{folder} (to be created in {existing})"
        raise ValueError(f"{shown} is not writable: {error.strerror or error}.") from None
    os.close(handle)
    os.remove(probe)


class RunFolder:
    """The output folder `path` of one training run. `overwrite`: replace the model and checkpoints it holds;
    `resume`: continue its training from them (not both)."""

    def __init__(self, path: str | os.PathLike, *, overwrite: bool = False, resume: bool = False):
        self.path = os.fspath(path)
        self.overwrite = overwrite
        self.resume = resume

    def check(self) -> None:
        """Raises a `ValueError` when the folder cannot be written, or holds a model or checkpoints and neither
        `overwrite` nor `resume` was asked for: a run must not silently replace a finished one, nor rotate its
        checkpoints away."""
        if self.overwrite and self.resume:
            raise ValueError(
                "Give --overwrite-output-dir (start afresh) or --resume-from-checkpoint (continue), not both."
            )
        folder = Path(self.path)
        check_writable_folder(folder)
        held = [name for name in MODEL_FILES if (folder / name).is_file()]
        held += [path.name for path in checkpoint_folders(folder)]
        if held and not (self.overwrite or self.resume):
            shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
            raise ValueError(
                f"{folder} already holds a model ({shown}): pass --overwrite-output-dir (`overwrite_output_dir=True`) "
                "to replace it, or --resume-from-checkpoint (`resume_from_checkpoint=True`) to continue its training."
            )

    def check_resume_keeps_the_model(self, checkpoint: str | os.PathLike | None) -> None:
        """Raises a `ValueError` when the folder's model holds another label count than the `checkpoint` this run
        resumes from (labels added by `add-labels` after the checkpoint was saved): the run's final save would put
        the checkpoint's labels over the added ones."""
        if checkpoint is None:
            return
        ours, theirs = _label_count(Path(self.path)), _label_count(Path(checkpoint))
        if ours is not None and theirs is not None and ours != theirs:
            raise ValueError(
                f"{self.path} holds a model of {ours:,} labels, and the checkpoint it resumes, {checkpoint}, one of "
                f"{theirs:,} (labels added since, e.g. by `haste-hf add-labels`): the run's final save would replace "
                "them. Resume into another --output-dir (`output_dir`), or add the labels again once training ends."
            )

    def held(self, is_main: bool = True):
        """A context in which this process (the main one of the run; the others hold nothing) owns the folder."""
        return output_dir_lock(self.path) if is_main else nullcontext()

    def clear_checkpoints(self) -> None:
        """Removes the checkpoints of the run that `overwrite` replaces: resuming or rotation would pick them."""
        if self.overwrite and not self.resume:
            for checkpoint in checkpoint_folders(self.path):
                shutil.rmtree(checkpoint)

    def save_trained(self, trainer, tokenizer, write_extra) -> None:
        """Switches the trained model of `trainer`, its `tokenizer`, its training arguments and what
        `write_extra(folder)` writes into the folder at once. Called on every rank: each rank writes its rows of
        a sharded output layer (`shard_checkpoints`); the main process writes the rest."""
        import torch
        from transformers.trainer import TRAINING_ARGS_NAME
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        from .callbacks import unwrap_model
        from .shard_checkpoints import save_sharded_folder
        from .sharded_output_layer import sharded_output_layer

        model = unwrap_model(trainer.model)

        def write(folder: Path, with_tokenizer: bool = False):
            if with_tokenizer and tokenizer is not None:
                tokenizer.save_pretrained(folder)
            torch.save(trainer.args, folder / TRAINING_ARGS_NAME)
            write_extra(folder)

        if sharded_output_layer(model) is not None:  # every rank writes its rows of the output layer
            # The checkpoint of the last step holds the same rows when it was the last thing the run did (weights
            # only: `save_only_model`): each rank links its shard rather than writing it again, checked byte for byte.
            last = Path(self.path) / f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"
            return save_sharded_folder(
                model,
                self.path,
                lambda staging: write(Path(staging), with_tokenizer=True),
                link_from=str(last) if last.is_dir() else None,
            )
        if trainer.is_world_process_zero():
            save_trained_folder(self.path, model, tokenizer, write)
        return None

    def add_files(self, write) -> None:
        """Switches what `write(folder)` writes (the results of the test evaluation) into the folder at once."""
        save_folder_atomically(self.path, lambda staging: write(Path(staging)))

    def push(self, training_args) -> None:
        """Publishes the finished folder to `training_args.hub_model_id` (default: the folder's name)."""
        from ..hub import push_to_hub

        push_to_hub(
            self.path,
            training_args.hub_model_id or Path(self.path).name,
            private=training_args.hub_private_repo,
            revision=training_args.hub_revision,
            token=training_args.hub_token,
        )


def _label_count(folder: Path) -> int | None:
    """The `label_count` of the model saved in `folder`; None where it has no readable one."""
    try:
        with open(folder / "config.json", encoding="utf-8") as f:
            count = json.load(f).get("label_count")
    except (OSError, ValueError, AttributeError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def check_output_dir(output_dir, *, overwrite: bool = False, resume: bool = False) -> None:
    """`RunFolder(output_dir, overwrite=overwrite, resume=resume).check()`."""
    RunFolder(output_dir, overwrite=overwrite, resume=resume).check()


__all__ = ["RunFolder", "check_output_dir", "check_writable_folder"]
