# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Publishing HASTE models on the Hugging Face Hub.

[`push_to_hub`] uploads, in one commit: `config.json` (with the `auto_map` of the exported classes), the
safetensors weights (sharded past `max_shard_size`), the label names, the Hub-exportable code (so that
`AutoModel.from_pretrained(repo_id, trust_remote_code=True)` works without `haste_hf`), an optional
tokenizer and a HASTE model card. A plain `PreTrainedModel.push_to_hub` would replace a local card with
the remote or a generic one and upload no code unless the classes were registered for auto classes.

Loading needs nothing from this module: `AutoModel.from_pretrained(repo_id)` after `import haste_hf`, or
with `trust_remote_code=True` anywhere.
"""

import errno
import json
import os
import shutil
import stat
import tempfile
import types
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from huggingface_hub import CommitInfo, CommitOperationAdd, CommitOperationDelete, HfApi, ModelCard, constants
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

from .modeling.configuration_haste import MODEL_AUTO_CLASSES, HasteConfig
from .modeling.saving import LABEL_NAMES_FILE, check_complete_save, exported_code_files, finish_interrupted_save


if TYPE_CHECKING:  # named in annotations only
    from transformers import PreTrainedModel


CONFIG_FILE = "config.json"
MODEL_CARD_FILE = "README.md"
AUTO_MAP = {
    "AutoConfig": "configuration_haste.HasteConfig",
    **dict.fromkeys(MODEL_AUTO_CLASSES, "modeling_haste.HasteForExtremeClassification"),
}
# Trainer output folders hold checkpoints and logs next to the final model: they are not published.
IGNORED_IN_FOLDERS = [".*", "checkpoint-*", "checkpoint-*/**", "runs/**", "__pycache__/**"]
# Weights of an earlier push with other sharding would shadow the new ones (transformers prefers
# `model.safetensors` over an index): remote files matching these and not re-uploaded are deleted.
WEIGHT_FILES = ["model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json"]


def push_to_hub(
    model: "PreTrainedModel | str | os.PathLike",
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    label_names: list[str] | None = None,
    tokenizer=None,
    model_card=None,
    max_shard_size: int | str | None = None,
    tags: list[str] | None = None,
    create_pr: bool = False,
    token: str | bool | None = None,
) -> CommitInfo:
    """Publishes a HASTE model on the Hub in one commit, ready for `AutoModel.from_pretrained(repo_id)`
    with `haste_hf` imported or with `trust_remote_code=True` without it.

    Args:
        model: a [`HasteForExtremeClassification`], or the folder a trained model was saved to (its files are
            uploaded as they are, except checkpoints, logs and hidden files; `config.json` gains `auto_map`). A link
            in it is refused; each file is opened once, without following links, and what was opened is uploaded.
            A hard link is a regular file: what it holds is uploaded. The program's own marks (hidden files) never
            are.
        repo_id: `namespace/name`, or `name` for the token's user; created if missing.
        private: visibility of a repository created by this call (an existing one keeps its own).
        revision: branch to push to, created from `main` if missing.
        commit_message / commit_description: of the commit; the message defaults to "Upload HASTE model".
        label_names: one name per label, replacing the model's own (`label_names.json`).
        tokenizer: saved with the model, so the repository serves both.
        model_card: a `ModelCard`, the card's text, or a `HasteModelCardData`. By default a folder's own
            `README.md`, else a card rendered from the model's configuration.
        max_shard_size: safetensors shard size (e.g. `"200MB"`) when pushing a model object; transformers'
            default otherwise.
        tags: added to the card's tags.
        create_pr: open a pull request instead of committing to the branch.
        token: Hub token; defaults to the logged-in one (`HF_TOKEN`).

    Returns:
        The `CommitInfo` of the commit (a string: the commit URL).
    """
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="haste-push-") as staging, ExitStack() as opened:
        staging = Path(staging)
        folder_files = {}  # path in the repository -> the file of the folder, open
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if isinstance(model, (str, os.PathLike)):
            if max_shard_size is not None:
                raise ValueError(
                    "`max_shard_size` re-shards a model object's weights; a folder is uploaded as saved. "
                    "Load it with `HasteForExtremeClassification.from_pretrained` to push it with other shards."
                )
            config, folder_files = _stage_folder(Path(model), staging, opened)
        elif model_type == HasteConfig.model_type:
            config = model.config
            model.save_pretrained(staging, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
        else:
            raise TypeError(
                f"`model` must be a HASTE model (model_type {HasteConfig.model_type!r}) or the folder of one, got "
                f"{type(model).__name__} (model_type {model_type!r})."
            )
        if label_names is not None:
            _write_label_names(staging, label_names, config.label_count)
        if tokenizer is not None:
            with tempfile.TemporaryDirectory(dir=staging) as tokenizer_files:
                tokenizer.save_pretrained(tokenizer_files)
                for name in os.listdir(tokenizer_files):
                    _replace(staging / name)
                    os.replace(os.path.join(tokenizer_files, name), staging / name)

        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        _stage_model_card(staging, model_card, config, repo_id, tags)
        if revision is not None and not revision.startswith("refs/pr/"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        staged = _staged_files(staging)
        additions = [CommitOperationAdd(name, str(staging / name)) for name in staged]
        additions += [CommitOperationAdd(name, file) for name, file in folder_files.items() if name not in staged]
        added = {operation.path_in_repo for operation in additions}
        remote = api.list_repo_files(repo_id, revision=constants.DEFAULT_REVISION if create_pr else revision)
        deletions = [
            CommitOperationDelete(name)
            for name in filter_repo_objects(remote, allow_patterns=WEIGHT_FILES)
            if name not in added
        ]
        return api.create_commit(
            repo_id,
            operations=[*deletions, *additions],
            commit_message=commit_message or "Upload HASTE model",
            commit_description=commit_description,
            revision=revision,
            create_pr=create_pr,
        )


def _staged_files(staging: Path) -> list[str]:
    """The files written into `staging` (`/`-separated), its hidden ones left out: the marks of a save (its id) are
    the program's, not the model's."""
    found = []
    for root, folders, files in os.walk(staging):
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [
            os.path.relpath(os.path.join(root, name), staging).replace(os.sep, "/")
            for name in files
            if not name.startswith(".")
        ]
    return sorted(found)


def open_published_file(folder: str | os.PathLike, relative: str) -> BinaryIO:
    """The file `relative` (`/`-separated) of `folder`, opened for reading without following a link at any step of
    its path, checked to be a regular file once open: what a push uploads is what was opened, even when the folder
    changes after it was listed. Raises a `ValueError` naming it otherwise."""
    path = os.path.join(folder, *relative.split("/"))
    refused = (
        f"{path} is a link, or not a regular file (swapped since the folder was listed?): only regular files inside "
        "the folder are published. Replace it with the file it stands for, or remove it."
    )
    nofollow, directory = getattr(os, "O_NOFOLLOW", 0), getattr(os, "O_DIRECTORY", 0)
    if os.open not in os.supports_dir_fd:  # Windows: the last step alone is checked
        parts, handle = [path], None
    else:
        parts, handle = relative.split("/"), os.open(folder, os.O_RDONLY | directory)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            flags = os.O_RDONLY | nofollow | getattr(os, "O_BINARY", 0) | (os.O_NONBLOCK if last else directory)
            try:
                opened = os.open(part, flags, dir_fd=handle)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise ValueError(refused) from None
                raise
            if handle is not None:
                os.close(handle)
            handle = opened
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise ValueError(refused)
        os.set_blocking(handle, True)
        file = os.fdopen(handle, "rb")
    except BaseException:
        if handle is not None:
            os.close(handle)
        raise
    return file


def _replace(path: Path):
    """Makes way for a new file at `path` in the staging folder; a link into the user's folder is removed,
    never written through."""
    if path.is_symlink() or path.exists():
        path.unlink()


def _stage_folder(folder: Path, staging: Path, opened: ExitStack) -> tuple[HasteConfig, dict]:
    """Opens the publishable files of a saved model folder (each once, without following links; see
    `open_published_file`), writes into `staging` its `config.json` with the exported code's `auto_map`, the code and
    its card; returns the folder's configuration (validated, format version included) and the other files, open."""
    if not (folder / CONFIG_FILE).is_file():
        raise ValueError(f"{folder} has no {CONFIG_FILE}: give the folder a HASTE model was saved to.")
    finish_interrupted_save(folder)
    check_complete_save(folder)
    files = {
        name: opened.enter_context(open_published_file(folder, name))
        for name in publishable_files(folder, IGNORED_IN_FOLDERS)
    }
    if CONFIG_FILE not in files:
        raise ValueError(f"{folder} has no {CONFIG_FILE}: give the folder a HASTE model was saved to.")
    try:
        config_dict = json.loads(files.pop(CONFIG_FILE).read())
    except ValueError as error:
        raise ValueError(f"{folder / CONFIG_FILE} is not JSON ({error}): save the model again.") from None
    if not isinstance(config_dict, dict) or config_dict.get("model_type") != HasteConfig.model_type:
        shown = config_dict.get("model_type") if isinstance(config_dict, dict) else None
        raise ValueError(
            f"{folder} holds a {shown!r} model, not a HASTE one "
            f"(model_type {HasteConfig.model_type!r}): push it with its own library."
        )
    config = HasteConfig.from_dict(config_dict)
    # Folders saved before every save exported the code lack these.
    config_dict["auto_map"] = {**config_dict.get("auto_map", {}), **AUTO_MAP}
    config_dict["custom_pipelines"] = config.to_dict()["custom_pipelines"]
    (staging / CONFIG_FILE).write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if MODEL_CARD_FILE in files:  # the card is read and may gain tags: its bytes, as opened
        (staging / MODEL_CARD_FILE).write_bytes(files.pop(MODEL_CARD_FILE).read())
    for path in exported_code_files():
        files.pop(os.path.basename(path), None)
        shutil.copyfile(path, staging / os.path.basename(path))
    return config, files


def publishable_files(folder: str | os.PathLike, ignore_patterns: list[str]) -> list[str]:
    """The paths (relative, `/`-separated) of the regular files of `folder` that an upload of it sends, those
    matching `ignore_patterns` (or the ones every upload leaves out, `.git`) left out. Raises a `ValueError` naming the first link or other non-regular entry it
    would send: an upload follows links, so a link in a model folder (an archive or a clone can carry one) would
    publish whatever it points to, `~/.ssh/id_rsa` included."""
    folder = os.fspath(folder)
    ignore_patterns = [*ignore_patterns, *DEFAULT_IGNORE_PATTERNS]

    def sent(relative: str, is_folder: bool) -> bool:
        candidates = [relative, relative + "/"] if is_folder else [relative]  # `runs/**` leaves out the folder `runs`
        return all(list(filter_repo_objects([candidate], ignore_patterns=ignore_patterns)) for candidate in candidates)

    found = []
    for root, folders, files in os.walk(folder):
        entries = [(name, True) for name in folders] + [(name, False) for name in files]
        folders[:] = []  # walked below only when sent
        for name, is_folder in sorted(entries):
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if not sent(relative, is_folder):
                continue
            if os.path.islink(path):
                raise ValueError(
                    f"{path} is a link (to {os.readlink(path)}): only regular files inside the folder are published. "
                    "Replace it with the file it stands for, or remove it."
                )
            if is_folder:
                folders.append(name)
            elif stat.S_ISREG(os.lstat(path).st_mode):
                found.append(relative)
            else:
                raise ValueError(f"{path} is not a regular file: only regular files are published; remove it.")
    return sorted(found)


def _write_label_names(staging: Path, label_names: list[str], label_count: int):
    if len(label_names) != label_count:
        raise ValueError(
            f"`label_names` has {len(label_names)} entries for {label_count} labels: give one name per label."
        )
    target = staging / LABEL_NAMES_FILE
    _replace(target)
    with open(target, "w", encoding="utf-8") as f:
        json.dump([str(name) for name in label_names], f, ensure_ascii=False)


def _stage_model_card(staging: Path, model_card, config: HasteConfig, repo_id: str, tags: list[str] | None):
    from .model_card import HasteModelCardData, render_model_card, write_model_card

    path = staging / MODEL_CARD_FILE
    if model_card is not None:
        _replace(path)
    if isinstance(model_card, HasteModelCardData):
        write_model_card(model_card, path)
    elif isinstance(model_card, ModelCard):
        model_card.save(path)
    elif isinstance(model_card, str):
        path.write_text(model_card, encoding="utf-8")
    elif model_card is not None:
        raise TypeError(
            f"`model_card` must be a ModelCard, a str or a HasteModelCardData, got {type(model_card).__name__}."
        )
    elif not path.exists():
        # The card only reads the configuration.
        render_model_card(HasteModelCardData.from_model(types.SimpleNamespace(config=config), model_id=repo_id)).save(
            path
        )
    if tags:
        card = ModelCard.load(path)
        card.data.tags = list(dict.fromkeys([*(card.data.tags or []), *tags]))
        _replace(path)
        card.save(path)


__all__ = ["AUTO_MAP", "publishable_files", "push_to_hub"]
