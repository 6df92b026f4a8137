"""The run lock where mutation testing changed it unnoticed: a restarted job with its old pid back, and the OS lock
alone (every refusal the tests checked passed on the pid alone)."""

import json
import os
import socket

import pytest
from transformers.testing_utils import CaptureLogger

from haste_hf.training import run_lock
from haste_hf.training.run_lock import LOCK_FILE, OutputDirInUseError, output_dir_lock


def plant_lock(folder, pid, host=None):
    folder.mkdir(parents=True, exist_ok=True)
    record = {"pid": pid, "host": host or socket.gethostname(), "started": "then"}
    (folder / LOCK_FILE).write_text(json.dumps(record))


def test_a_restarted_job_with_its_old_pid_takes_its_own_stale_lock_over(tmp_path):
    """In a container a restarted job often gets the pid its previous run had: a lock naming this very process,
    held by no one, is stale, not another run's."""
    folder = tmp_path / "out"
    plant_lock(folder, os.getpid())
    with CaptureLogger(run_lock.logger) as captured, output_dir_lock(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert "taking over the lock of process" in captured.out


@pytest.mark.skipif(run_lock.fcntl is None, reason="no OS file locks: the owner's pid alone decides")
@pytest.mark.parametrize("content", ["not json", json.dumps({"pid": 1, "host": "elsewhere"})])
def test_the_os_lock_alone_refuses_a_second_run(tmp_path, content):
    """A run holding the OS lock is refused whatever its file says (it may not have written it yet, or names a pid
    this host cannot ask about)."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(content)
    holder = os.open(folder / LOCK_FILE, os.O_RDWR)  # another open file description: flock conflicts with it
    try:
        run_lock.fcntl.flock(holder, run_lock.fcntl.LOCK_EX | run_lock.fcntl.LOCK_NB)
        with (
            pytest.raises(OutputDirInUseError, match="is being written by another training run"),
            output_dir_lock(folder),
        ):
            pass
    finally:
        os.close(holder)
    with output_dir_lock(folder):  # released: taken over
        pass
