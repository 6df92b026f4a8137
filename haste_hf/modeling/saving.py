# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The output folder, all-or-nothing: a model folder (weights, configuration, label names, code, tokenizer,
card and extra files switched in at once), single output files (predictions, metrics, groupings), the marks
of interrupted saves and which Trainer checkpoints finished saving.

Flat and Hub-exportable (imports only torch and transformers): exported remote code saves and loads
model folders through it without this package.
"""

import json
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from .logging_utils import get_logger


LABEL_NAMES_FILE = "label_names.json"
TRAINER_STATE_FILE = "trainer_state.json"
# Saves stage their files in a hidden folder inside the target and mark the target while they move the
# files in: a save killed midway leaves the mark, and loading refuses a folder that mixes two saves.
STAGING_PREFIX = ".haste-staging-"
INCOMPLETE_SAVE_FILE = ".haste-save-incomplete"
# Written by each save after its files are in, before the mark goes: a new id per save, so a reader that finds the
# same id before and after reading read one save (`read_one_save`).
SAVE_GENERATION_FILE = ".haste-save-generation"

logger = get_logger(__name__)


def exported_code_files() -> list[str]:
    """Paths of the modules `trust_remote_code=True` loading needs: the modeling file and its relative imports
    (the modeling file is this module's sibling, exported with it)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    modeling_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modeling_haste.py")
    return [modeling_file, *get_relative_import_files(modeling_file)]


def check_complete_save(folder: str):
    """Raises an `OSError` when `folder` holds the mark of an interrupted or unfinished save (see
    `save_folder_atomically`)."""
    if os.path.lexists(os.path.join(folder, INCOMPLETE_SAVE_FILE)):
        raise OSError(
            f"{folder} holds an interrupted save, or one still running ({INCOMPLETE_SAVE_FILE} is present): its files "
            "may mix two saves. Let a running save finish, save the model to it again, or load an earlier checkpoint."
        )


def save_generation(folder: str) -> str | None:
    """The id of the save `folder` holds (None for a folder saved before saves wrote one); raises an `OSError` while a
    save is unfinished or after one was interrupted."""
    check_complete_save(folder)
    path = os.path.join(folder, SAVE_GENERATION_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            generation = json.load(f)["generation"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        raise OSError(f"{path} is damaged ({error}): save the model to {folder} again.") from None
    return str(generation)


def read_one_save(folder: str | os.PathLike, read, attempts: int = 3, wait_seconds: float = 60.0):
    """`read()` (a load of files of `folder`: weights, label names, tokenizer...) when `folder` held one save from its
    start to its end; when a save replaced files meanwhile, `read` runs again once that save has finished (waiting
    up to `wait_seconds` for a save of this host that is running), up to `attempts` times; then an `OSError` says
    so. A folder that is not a local one (a Hub id) is read once."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return read()
    for _ in range(attempts):
        _wait_for_running_save(folder, wait_seconds)
        before = save_generation(folder)
        result = read()
        if not os.path.lexists(os.path.join(folder, INCOMPLETE_SAVE_FILE)) and save_generation(folder) == before:
            return result
    raise OSError(
        f"{folder} was saved to while it was read, {attempts} times: what was read may mix two saves. Load it "
        "again when the saves to it have finished."
    )


def _wait_for_running_save(folder: str, seconds: float) -> None:
    """Returns when `folder` holds no mark of a save, when the save that marked it is not running on this host (an
    interrupted one: loading refuses it), or after `seconds`."""
    marker = os.path.join(folder, INCOMPLETE_SAVE_FILE)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(marker, encoding="utf-8") as f:
                owner = json.load(f)
        except FileNotFoundError:
            return
        except ValueError:  # damaged: loading refuses it
            return
        if not (isinstance(owner, dict) and owner.get("host") == socket.gethostname() and _is_pid(owner.get("pid"))):
            return  # of another host, of a failed save, or of a version that did not name its process
        if owner["pid"] == os.getpid() or not process_is_running(owner["pid"]):
            return
        time.sleep(0.02)


@contextmanager
def _one_save_at_a_time(target: str):
    """Holds an exclusive lock on the folder `target` (POSIX `flock` of the folder itself, no lock file), so two saves
    to it never move their files in together; where folders cannot be locked (Windows, some network file
    systems) saves are not serialized."""
    try:
        import fcntl

        handle = os.open(target, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        with suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def save_folder_atomically(target: str, write) -> None:
    """Calls `write(staging)` to write files into a fresh hidden folder inside `target`, then moves them
    into `target`, replacing what was there: a failed `write` leaves `target` as it was, a kill while the
    files move in leaves a mark that loading refuses. Only `target` need be writable, not its parent.
    Leftovers of killed saves are removed; when the new files include weights, weight files they do not
    replace are removed too (a single file would shadow new shards, and the other way round)."""
    target = os.fspath(target)
    if os.path.isfile(target):
        raise ValueError(f"`save_directory` ({target}) is a file: give a folder path.")
    os.makedirs(target, exist_ok=True)
    for name in os.listdir(target):
        if name.startswith(STAGING_PREFIX) and not _staging_owner_is_running(name):
            shutil.rmtree(os.path.join(target, name), ignore_errors=True)
    # Named by host and process, so a save running beside this one (another process) keeps its staging folder.
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=target)
    try:
        write(staging)
        new_files = sorted(os.listdir(staging))
        with _one_save_at_a_time(target):
            # The mark and the id are written beside the files and moved in: a link planted at their names is
            # replaced, not written through.
            # The mark names this process, so that readers wait for the save while it runs.
            _move_in_json(staging, target, INCOMPLETE_SAVE_FILE, {"files": new_files, **_this_process()})
            try:
                if any(map(_is_weight_file, new_files)):
                    for stale in os.listdir(target):
                        if _is_weight_file(stale) and stale not in new_files:
                            os.remove(os.path.join(target, stale))
                for name in new_files:
                    destination = os.path.join(target, name)
                    if os.path.isdir(destination) and not os.path.islink(destination):
                        shutil.rmtree(destination)
                    os.replace(os.path.join(staging, name), destination)
                generation = {"generation": uuid.uuid4().hex, "files": new_files}
                _move_in_json(staging, target, SAVE_GENERATION_FILE, generation)
            except BaseException:
                with suppress(OSError):  # no longer running: readers refuse the folder at once
                    _move_in_json(staging, target, INCOMPLETE_SAVE_FILE, {"files": new_files})
                raise
            os.remove(os.path.join(target, INCOMPLETE_SAVE_FILE))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _is_pid(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _move_in_json(staging: str, target: str, name: str, content: dict) -> None:
    with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
        json.dump(content, f)
    os.replace(os.path.join(staging, name), os.path.join(target, name))


def _this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def process_is_running(pid: int) -> bool:
    """Whether process `pid` of this host exists (one of another user included); True where it cannot be asked
    without harm (Windows, where `os.kill` ends the process)."""
    if os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _staging_owner_is_running(name: str) -> bool:
    """Whether the save that staged folder `name` may still be writing it: its process runs, or it ran on another
    host (which this one cannot ask). Folders of saves that died, and unnamed ones of older versions, are leftovers."""
    host_and_pid = name[len(STAGING_PREFIX) :].rpartition("-")[0]
    host, _, pid = host_and_pid.rpartition("-")
    if not host or not pid.isdigit():
        return False
    return host != socket.gethostname() or process_is_running(int(pid))


def _is_weight_file(name: str) -> bool:
    return name.startswith("model") and name.endswith((".safetensors", ".safetensors.index.json"))


def check_finite_weights(state_dict) -> None:
    """Raises a `ValueError` naming the floating tensors of `state_dict` that hold NaN or infinity (one
    device sync per device, no overflow on large finite values)."""
    named = [(name, tensor) for name, tensor in state_dict.items() if tensor.is_floating_point() and tensor.numel()]
    by_device = {}
    for name, tensor in named:
        by_device.setdefault(tensor.device, []).append((name, tensor))
    bad = []
    for pairs in by_device.values():
        largest = torch._foreach_norm([tensor.detach() for _, tensor in pairs], ord=float("inf"))
        finite = torch.stack([value.float() for value in largest]).isfinite().tolist()
        bad += [name for (name, _), ok in zip(pairs, finite) if not ok]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ValueError(
            f"Refusing to save non-finite (NaN or infinite) weights in {shown}: training diverged. Lower the "
            "learning rates, or train with `on_non_finite='skip'` to skip steps whose gradients are not finite."
        )


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary path beside `path` to write to; it replaces `path` only when the block ends
    without an error, so `path` is never half-written. The folder of `path` must exist."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it first.")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=folder)
    os.close(handle)
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_trained_folder(folder: str | os.PathLike, model, tokenizer=None, write_extra=None, state_dict=None) -> None:
    """Saves `model` (weights, configuration, label names, exportable code), `tokenizer` and whatever `write_extra(staging)`
    writes (card, metrics) into `folder` in one switch: a failure or a kill leaves the previous contents,
    or a folder that loading refuses, never a model without its tokenizer or card. `state_dict`: the
    weights to write instead of the model's own (a sharded output layer's gathered shares)."""

    def write(staging):
        model.save_pretrained(
            staging, state_dict=state_dict
        )  # the exportable code goes along (see haste_hf/__init__.py)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if write_extra is not None:
            write_extra(Path(staging))

    save_folder_atomically(os.fspath(folder), write)


# ------------------------------------------------------------------------------------------------ checkpoints


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why a Trainer checkpoint did not finish saving, or None when it did: its trainer state, written last, is
    there and reads, no save of its model was interrupted, and its safetensors weights are whole (a full disk or a
    copy cut short truncates them)."""
    state_file = os.path.join(folder, TRAINER_STATE_FILE)
    if not os.path.isfile(state_file):
        return f"no {TRAINER_STATE_FILE}"
    if os.path.exists(os.path.join(folder, INCOMPLETE_SAVE_FILE)):
        return "an interrupted save"
    from safetensors import SafetensorError, safe_open
    from transformers.trainer_callback import TrainerState  # training only: loading a model needs none of it

    try:
        TrainerState.load_from_json(state_file)
    except (ValueError, TypeError, KeyError):
        return f"an unreadable {TRAINER_STATE_FILE}"
    weight_files = [SAFE_WEIGHTS_NAME] if os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)) else []
    index_file = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index_file):
        try:
            with open(index_file, encoding="utf-8") as f:
                weight_files += sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"an unreadable {SAFE_WEIGHTS_INDEX_NAME}"
    for name in weight_files:
        try:
            with safe_open(os.path.join(folder, name), framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            return f"a damaged {name} ({error})"
    return None


def checkpoint_is_complete(folder: str | os.PathLike) -> bool:
    """Whether a Trainer checkpoint finished saving (see `checkpoint_problem`)."""
    return checkpoint_problem(folder) is None


def checkpoint_folders(output_dir: str | os.PathLike) -> list[Path]:
    """The `checkpoint-N` folders of `output_dir` (complete or not), by increasing N."""
    # Imported here: `transformers.trainer_utils` imports peft, which loads transformers' auto models, which
    # register HASTE's by importing the modeling file and so this one (see `auto_registration`).
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not os.path.isdir(output_dir):
        return []
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    found = [
        (int(match.group(1)), path)
        for path in Path(output_dir).iterdir()
        if (match := pattern.match(path.name)) and path.is_dir()
    ]
    return [path for _, path in sorted(found)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The `checkpoint-N` folder of `output_dir` with the highest N that finished saving (one a kill left
    half-written, or whose weights are damaged, is passed over with a warning), or None."""
    for path in reversed(checkpoint_folders(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            return str(path)
        logger.warning(f"Passing over {path}: it is not a complete checkpoint ({problem}).")
    return None


__all__ = [
    "INCOMPLETE_SAVE_FILE",
    "LABEL_NAMES_FILE",
    "SAVE_GENERATION_FILE",
    "atomic_path",
    "check_complete_save",
    "check_finite_weights",
    "checkpoint_folders",
    "checkpoint_is_complete",
    "checkpoint_problem",
    "exported_code_files",
    "last_complete_checkpoint",
    "read_one_save",
    "save_folder_atomically",
    "save_generation",
    "save_trained_folder",
]
