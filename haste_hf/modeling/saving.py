# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The output folder, all-or-nothing: a model folder (weights, configuration, label names, code, tokenizer,
card and extra files switched in at once), single output files (predictions, metrics, groupings), the marks
of interrupted saves and which Trainer checkpoints finished saving.

Flat and Hub-exportable (imports only torch and transformers): exported remote code saves and loads
model folders through it without this package.
"""

import functools
import json
import os
import re
import shutil
import socket
import stat
import tempfile
import time
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

import torch
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

from .logging_utils import get_logger
from .output_shards import OUTPUT_SHARDS_INDEX, OutputShards, is_plain_file_name


LABEL_NAMES_FILE = "label_names.json"
TRAINER_STATE_FILE = "trainer_state.json"
# A save writes its files into a hidden staging folder inside the target, then switches them in: it writes a journal
# (INCOMPLETE_SAVE_FILE, naming the staging folder, its files and the save's id: the commit point), moves the files
# in, writes the id (SAVE_GENERATION_FILE) and removes the journal. Killed before the journal, it leaves the folder
# as it was (the next save removes its staging folder); killed after, it leaves a folder whose next load or save
# finishes the switch from the journal (`finish_interrupted_save`). Either way the folder loads as one whole save.
STAGING_PREFIX = ".haste-staging-"
INCOMPLETE_SAVE_FILE = ".haste-save-incomplete"
# A new id per save, so a reader that finds the same id before and after reading read one save (`read_one_save`).
SAVE_GENERATION_FILE = ".haste-save-generation"
# Every file a save writes for its own bookkeeping: never part of the model, never published.
INTERNAL_FILES = (INCOMPLETE_SAVE_FILE, SAVE_GENERATION_FILE)
# What the names of those files and of the staging folders start with: an upload leaves out every path holding one.
INTERNAL_PREFIX = ".haste-"
# The marks are a few hundred bytes; anything larger is not one this program wrote.
MARK_SIZE_LIMIT = 1 << 20

logger = get_logger(__name__)


def exported_code_files() -> list[str]:
    """Paths of the modules `trust_remote_code=True` loading needs: the modeling file and its relative imports
    (the modeling file is this module's sibling, exported with it)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    modeling_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modeling_haste.py")
    return [modeling_file, *get_relative_import_files(modeling_file)]


def read_mark(path: str):
    """The JSON content of the mark file `path` (None when there is none), read only when it is a small regular
    file: opened without following a link and without blocking, so that a FIFO cannot hold the reader forever, a
    device (`/dev/zero`) cannot fill its memory, and a link cannot be read out of the folder. Raises an `OSError`
    naming the file otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        handle = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as error:  # ELOOP: a link
        kind = "a link" if os.path.islink(path) else f"unreadable ({error.strerror})"
        raise OSError(f"{path} is {kind}, not a mark this program wrote: remove it, then try again.") from None
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MARK_SIZE_LIMIT:
            kind = "larger than a mark" if stat.S_ISREG(info.st_mode) else "not a regular file"
            raise OSError(f"{path} is {kind}, not a mark this program wrote: remove it, then try again.")
        content = os.read(handle, MARK_SIZE_LIMIT + 1)
    finally:
        os.close(handle)
    try:
        return json.loads(content)
    except ValueError as error:
        raise OSError(f"{path} is damaged ({error}): save the model to its folder again.") from None


def check_complete_save(folder: str):
    """Raises an `OSError` when `folder` holds the mark of a save that is unfinished, or was interrupted and cannot
    be finished (see `save_folder_atomically`)."""
    path = os.path.join(folder, INCOMPLETE_SAVE_FILE)
    if os.path.lexists(path):
        read_mark(path)  # a file there that is no mark is named as such
        raise OSError(
            f"{folder} holds an interrupted save, or one still running ({INCOMPLETE_SAVE_FILE} is present): its files "
            "may mix two saves. Let a running save finish, save the model to it again, or load an earlier checkpoint."
        )


def save_generation(folder: str) -> str | None:
    """The id of the save `folder` holds (None for a folder saved before saves wrote one); raises an `OSError` while a
    save is unfinished or after one was interrupted."""
    check_complete_save(folder)
    path = os.path.join(folder, SAVE_GENERATION_FILE)
    generation = read_mark(path)
    if generation is None:
        return None
    if not (isinstance(generation, dict) and isinstance(generation.get("generation"), str)):
        raise OSError(f"{path} is damaged (no `generation`): save the model to {folder} again.")
    return generation["generation"]


def read_one_save(folder: str | os.PathLike, read, attempts: int = 3, wait_seconds: float = 60.0):
    """`read()` (a load of files of `folder`: weights, label names, tokenizer...) when `folder` held one save from its
    start to its end; when a save replaced files meanwhile, `read` runs again once that save has finished (waiting
    up to `wait_seconds` for a save that is switching its files in; one that was killed doing so is finished first,
    see `finish_interrupted_save`), up to `attempts` times; then an `OSError` says so. A folder that is not a local
    one (a Hub id) is read once."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        return read()
    for _ in range(attempts):
        finish_interrupted_save(folder, wait_seconds)
        before = save_generation(folder)
        result = read()
        if not os.path.lexists(os.path.join(folder, INCOMPLETE_SAVE_FILE)) and save_generation(folder) == before:
            return result
    raise OSError(
        f"{folder} was saved to while it was read, {attempts} times: what was read may mix two saves. Load it "
        "again when the saves to it have finished."
    )


def finish_interrupted_save(folder: str | os.PathLike, wait_seconds: float | None = 60.0) -> None:
    """Finishes the switch of a save to `folder` that was stopped (killed, or failed) after its journal was written:
    moves the rest of its files in from its staging folder, so that the folder holds that save whole. Waits up to
    `wait_seconds` (None: as long as it takes) for a save that is switching its files in now; returns without a
    change when the wait runs out or the folder holds no journal this can finish (loading then refuses the mark).
    Raises an `OSError` when the switch cannot be finished for want of write access."""
    folder = os.fspath(folder)
    if not os.path.lexists(os.path.join(folder, INCOMPLETE_SAVE_FILE)):
        return
    with _one_save_at_a_time(folder, wait_seconds) as held:
        if not held:
            return
        journal = _journal_to_finish(folder)
        if journal is None:
            return
        try:
            _switch_in(folder, journal)
        except PermissionError as error:
            raise OSError(
                f"{folder} holds a save that was stopped while its files moved in; finishing it needs write access "
                f"({error.strerror}): load it once as a user who can write to it, or save the model to it again."
            ) from None


def _journal_to_finish(folder: str) -> dict | None:
    """The journal of `folder` when it names a staging folder that is there and the files to move from it; None when
    there is none, or it is not one this can finish (a mark of a version that wrote no journal, a damaged one)."""
    try:
        journal = read_mark(os.path.join(folder, INCOMPLETE_SAVE_FILE))
    except OSError:
        return None
    if not isinstance(journal, dict):
        return None
    staging, files, generation = journal.get("staging"), journal.get("files"), journal.get("generation")
    if not (
        _is_plain_name(staging)
        and staging.startswith(STAGING_PREFIX)
        and isinstance(generation, str)
        and isinstance(files, list)
        and all(map(_is_plain_name, files))
    ):
        return None
    try:
        if not stat.S_ISDIR(os.lstat(os.path.join(folder, staging)).st_mode):
            return None
    except FileNotFoundError:
        return None
    return journal


def _is_plain_name(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and os.sep not in name


def _wait_for_running_save(folder: str, seconds: float | None) -> bool:
    """Where folders cannot be locked: whether the save that wrote the journal of `folder` has ended (its process of
    this host is gone), waiting up to `seconds` for it. A journal of another host cannot be told from a running
    save: False."""
    deadline = None if seconds is None else time.monotonic() + seconds
    while True:
        try:
            owner = read_mark(os.path.join(folder, INCOMPLETE_SAVE_FILE))
        except OSError:
            return False
        if owner is None:
            return True
        if not (isinstance(owner, dict) and owner.get("host") == socket.gethostname() and _is_pid(owner.get("pid"))):
            return False
        if owner["pid"] == os.getpid() or not process_is_running(owner["pid"]):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


@contextmanager
def _one_save_at_a_time(target: str, wait_seconds: float | None = None):
    """Holds an exclusive lock on the folder `target` (POSIX `flock` of the folder itself, no lock file), so two
    processes never switch files into it together; yields whether it may go on: False when `wait_seconds` passed
    without the lock. Where folders cannot be locked (Windows, some network file systems), the owner of a journal
    is waited for by its process id instead."""
    try:
        import fcntl

        handle = os.open(target, os.O_RDONLY)
    except (ImportError, OSError):
        yield _wait_for_running_save(target, wait_seconds)
        return
    try:
        deadline = None if wait_seconds is None else time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(0.02)
            except OSError:  # locks not supported here
                held = _wait_for_running_save(target, wait_seconds)
                break
        yield held
    finally:
        os.close(handle)  # releases the lock


def save_folder_atomically(target: str, write) -> None:
    """Calls `write(staging)` to write files into a fresh hidden folder inside `target`, then switches them into
    `target`, replacing what was there: a failed `write` leaves `target` as it was; a save stopped at any point of
    the switch leaves a journal from which the next load or save finishes it, so that the folder always loads as the
    previous save or as this one. Only `target` need be writable, not its parent. Leftovers of killed saves are
    removed; when the new files include weights, weight files they do not replace are removed too (a single file
    would shadow new shards, and the other way round)."""
    target = os.fspath(target)
    if os.path.isfile(target):
        raise ValueError(f"`save_directory` ({target}) is a file: give a folder path.")
    os.makedirs(target, exist_ok=True)
    with _one_save_at_a_time(target):
        _finish_then_clear(target)
    # Named by host and process, so a save running beside this one (another process) keeps its staging folder.
    staging = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{socket.gethostname()}-{os.getpid()}-", dir=target)
    committed = switched = False
    try:
        write(staging)
        for name in INTERNAL_FILES:  # the id of a save `write` made into the staging folder: this save writes its own
            with suppress(FileNotFoundError):
                os.remove(os.path.join(staging, name))
        new_files = sorted(os.listdir(staging))
        journal = {
            "staging": os.path.basename(staging),
            "files": new_files,
            "generation": uuid.uuid4().hex,
            **_this_process(),
        }
        _sync_tree(staging)  # the journal promises these files: they are on disk before it is
        with _one_save_at_a_time(target):
            _finish_then_clear(target)
            # Written beside the files and moved in, as the id: a link planted at their names is replaced, not
            # written through.
            _move_in_json(staging, target, INCOMPLETE_SAVE_FILE, journal)
            committed = True
            _switch_in(target, journal)
            switched = True
    finally:
        if switched or not committed:  # a switch left unfinished keeps its staging folder: the journal names it
            shutil.rmtree(staging, ignore_errors=True)


def _finish_then_clear(target: str) -> None:
    """Under the folder's lock: finishes a switch that was stopped, then removes the staging folders of saves that
    no longer run."""
    journal = _journal_to_finish(target)
    if journal is not None:
        _switch_in(target, journal)
    for name in os.listdir(target):
        if name.startswith(STAGING_PREFIX) and not _staging_owner_is_running(name):
            shutil.rmtree(os.path.join(target, name), ignore_errors=True)


def _switch_in(target: str, journal: dict) -> None:
    """Moves the files `journal` names from its staging folder into `target` (those moved already are passed over),
    writes the save's id, removes the journal and the staging folder. Repeating it after a stop at any point ends
    the same way."""
    staging = os.path.join(target, journal["staging"])
    new_files = journal["files"]
    if any(map(_is_weight_file, new_files)):
        for stale in os.listdir(target):
            if _is_weight_file(stale) and stale not in new_files:
                with suppress(FileNotFoundError):
                    os.remove(os.path.join(target, stale))
    for name in new_files:
        source, destination = os.path.join(staging, name), os.path.join(target, name)
        if not os.path.lexists(source):
            continue  # moved in before the stop
        if os.path.isdir(destination) and not os.path.islink(destination):
            shutil.rmtree(destination)
        with suppress(FileNotFoundError):  # moved meanwhile where the folder could not be locked
            os.replace(source, destination)
    _move_in_json(staging, target, SAVE_GENERATION_FILE, {"generation": journal["generation"], "files": new_files})
    _sync_folder(target)
    with suppress(FileNotFoundError):
        os.remove(os.path.join(target, INCOMPLETE_SAVE_FILE))
    _sync_folder(target)
    shutil.rmtree(staging, ignore_errors=True)


def _sync_tree(folder: str) -> None:
    """Flushes the files and folders under `folder` to the disk, so that a power cut after the journal is written
    cannot lose what it names (a kill alone loses nothing written)."""
    for root, _, names in os.walk(folder):
        for name in names:
            with suppress(OSError):
                handle = os.open(os.path.join(root, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
                try:
                    os.fsync(handle)
                finally:
                    os.close(handle)
        _sync_folder(root)


def _sync_folder(folder: str) -> None:
    """Flushes the entries of `folder` (its renames) to the disk, where folders can be flushed."""
    with suppress(OSError):
        handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def _is_pid(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _move_in_json(staging: str, target: str, name: str, content: dict) -> None:
    path = os.path.join(staging, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path, os.path.join(target, name))


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
    without an error, so `path` is never half-written. The folder of `path` must exist. The file gets the mode
    `open` gives a new file (0o666 less the umask), not `tempfile.mkstemp`'s 0o600, which left predictions, metrics
    and layouts unreadable to the user's group."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: the folder {folder} does not exist; create it first.")
    temporary = os.fspath(folder / f".{path.name}.{uuid.uuid4().hex[:12]}.partial")
    os.close(os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    mode = stat.S_IMODE(os.stat(temporary).st_mode)
    try:
        yield temporary
        os.chmod(temporary, mode)  # safetensors' writer, for one, replaces the file with one of mode 0o600
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def save_trained_folder(folder: str | os.PathLike, model, tokenizer=None, write_extra=None) -> None:
    """Saves `model` (weights, configuration, label names, exportable code), `tokenizer` and whatever `write_extra(staging)`
    writes (card, metrics) into `folder` in one switch: a failure or a kill leaves the previous contents,
    or a folder that loading refuses, never a model without its tokenizer or card."""

    def write(staging):
        model.save_pretrained(staging)  # the exportable code goes along (see haste_hf/__init__.py)
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
    if os.path.lexists(os.path.join(folder, INCOMPLETE_SAVE_FILE)):
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
    try:
        shards = OutputShards.open(folder)  # a label-sharded run's output layer
    except ValueError as error:
        return f"an invalid {OUTPUT_SHARDS_INDEX} ({error})"
    weight_files += [] if shards is None else [shard["file"] for shard in shards.shards]
    for name in weight_files:
        try:
            with safe_open(os.path.join(folder, name), framework="pt"):
                pass
        except (SafetensorError, OSError) as error:
            return f"a damaged {name} ({error})"
    return None


# The weights a checkpoint may store the output layer's head and tail in (a folder chooses no other dtype).
_OUTPUT_WEIGHT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def stored_output_dtypes(source, shards: "OutputShards | None" = None, **hub_kwargs) -> dict[str, torch.dtype]:
    """`{"head": dtype, "tail": dtype}`: how the checkpoint `source` (a folder or a Hub id) stores the output layer's
    weights, read from the safetensors headers (no tensor is read). A run with a bf16 output layer saves it in bf16
    beside a float32 encoder, and `from_pretrained` loads every weight in one dtype: this is what it casts the layer
    back to. A branch the checkpoint lacks, or stores in a dtype that is no weight dtype, is left out."""
    from safetensors import SafetensorError, safe_open
    from transformers.utils import cached_file

    names = {branch: f"output_layer.{branch}.weight" for branch in ("head", "tail")}
    if shards is not None:
        return {branch: shards.dtype(name) for branch, name in names.items() if name in shards.shapes}
    fetch = functools.partial(
        cached_file,
        source,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )
    index_file, weight_map = fetch(SAFE_WEIGHTS_INDEX_NAME), {}
    if index_file is not None:
        with open(index_file, encoding="utf-8") as f:
            weight_map = json.load(f).get("weight_map") or {}
    dtypes = {}
    for branch, name in names.items():
        for key in (name, name.removeprefix("output_layer.")):  # format 2 names it without the prefix
            file = weight_map.get(key) if index_file is not None else SAFE_WEIGHTS_NAME
            path = fetch(file) if is_plain_file_name(file) else None
            if path is None:
                continue
            try:
                with safe_open(path, framework="pt") as handle:
                    stored = handle.get_slice(key).get_dtype() if key in handle.keys() else None  # noqa: SIM118
            except (SafetensorError, OSError):
                stored = None
            if stored in _OUTPUT_WEIGHT_DTYPES:
                dtypes[branch] = _OUTPUT_WEIGHT_DTYPES[stored]
                break
    return dtypes


def to_stored_dtypes_(output_layer, source, shards: "OutputShards | None", load_kwargs: dict, **hub_kwargs) -> None:
    """Casts the head and the tail of `output_layer`, just loaded from `source`, to the dtypes the checkpoint stores
    them in (`stored_output_dtypes`); not under a device map (its offloaded weights stay as it loaded them)."""
    if load_kwargs.get("device_map") is not None:
        return
    for branch, dtype in stored_output_dtypes(source, shards, **hub_kwargs).items():
        if getattr(output_layer, branch) is not None:
            getattr(output_layer, branch).to(dtype)


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
    "INTERNAL_FILES",
    "LABEL_NAMES_FILE",
    "SAVE_GENERATION_FILE",
    "atomic_path",
    "check_complete_save",
    "check_finite_weights",
    "checkpoint_folders",
    "checkpoint_is_complete",
    "checkpoint_problem",
    "exported_code_files",
    "finish_interrupted_save",
    "last_complete_checkpoint",
    "read_mark",
    "read_one_save",
    "save_folder_atomically",
    "save_generation",
    "save_trained_folder",
    "stored_output_dtypes",
    "to_stored_dtypes_",
]
