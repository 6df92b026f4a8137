# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""One training run per output folder.

Two runs writing into one folder would interleave their checkpoints (resuming or rotation would then pick
the other run's), and the later final save would replace the earlier run's model. A run holds a lock file
in its output folder from its start to its end: an OS file lock (released by the kernel when the process
dies, however it dies) on a file naming the owner's host and process id, for the message to the second run.
A lock file whose owner is gone is taken over with a warning.
"""

import json
import os
import socket
import time
from contextlib import contextmanager, suppress
from pathlib import Path

from ..modeling.logging_utils import get_logger
from ..modeling.saving import process_is_running


try:
    import fcntl
except ImportError:  # Windows: the owner's process id alone tells a live lock from a stale one
    fcntl = None


LOCK_FILE = ".haste-train.lock"

logger = get_logger(__name__)


class OutputDirInUseError(RuntimeError):
    """Another training run holds the output folder."""


def _read_owner(fd: int) -> dict | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 4096).decode("utf-8", errors="replace")
    try:
        owner = json.loads(text)
    except ValueError:
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _describe(owner: dict | None) -> str:
    if owner is None:
        return "an unknown process"
    since = f", since {owner['started']}" if "started" in owner else ""
    return f"process {owner['pid']} on host {owner.get('host', '?')}{since}"


def _is_live_other(owner: dict | None) -> bool:
    """Whether `owner` is another process of this host that still runs."""
    return (
        owner is not None
        and owner.get("host") == socket.gethostname()
        and owner["pid"] != os.getpid()
        and process_is_running(owner["pid"])
    )


def _acquire(path: Path) -> int:
    """An open descriptor of the lock file at `path`, locked and naming this process."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            held = False
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    held = True
            owner = _read_owner(fd)
            if held or _is_live_other(owner):
                raise OutputDirInUseError(
                    f"{path.parent} is being written by another training run ({_describe(owner)}): wait for it to end "
                    f"or give another output folder (--output-dir, `output_dir`). If no such run is alive, delete {path}."
                )
            try:  # its previous holder may have removed the file between our open and our lock: lock the new one
                same_file = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same_file = False
            if not same_file:
                os.close(fd)
                continue
            if os.fstat(fd).st_size:
                logger.warning(f"{path}: taking over the lock of {_describe(owner)}, which ended without releasing it.")
            record = json.dumps(
                {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            )
            os.ftruncate(fd, 0)
            os.pwrite(fd, record.encode("utf-8"), 0)
            return fd
        except BaseException:
            os.close(fd)
            raise


@contextmanager
def output_dir_lock(output_dir: str | os.PathLike):
    """Holds `output_dir` for this process while the block runs (created if missing, and removed again if the
    run left it empty); raises `OutputDirInUseError` naming the owner when another run holds it."""
    folder = Path(output_dir)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    try:
        fd = _acquire(path)
    except BaseException:
        if created:
            _remove_if_empty(folder)
        raise
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            os.remove(path)  # before unlocking: a run that opened this file meanwhile sees it gone and opens a new one
        os.close(fd)
        if created:
            _remove_if_empty(folder)


def _remove_if_empty(folder: Path) -> None:
    with suppress(OSError):
        folder.rmdir()


__all__ = ["LOCK_FILE", "OutputDirInUseError", "output_dir_lock"]
