"""Runs that must not be lost, and runs refused up front in one line: two runs into one output folder, an
output folder that cannot be written, empty shares of a sharded output layer, a token length beyond the
encoder's, resuming from a checkpoint of another model, and the library errors the command line reports.

The command-line helpers and data come from test_faults.py."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from test_faults import CLI_LABELS, assert_no_leftovers, assert_one_line_error, cli_files, make_model, run_cli, train_flags  # noqa: F401
from transformers.testing_utils import CaptureLogger

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling_haste import STAGING_PREFIX
from haste_hf.run_lock import LOCK_FILE, OutputDirInUseError, output_dir_lock


# ------------------------------------------------------------------------------------- one run per output folder


def dead_pid() -> int:
    """The id of a process of this host that has ended."""
    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


def plant_lock(folder, pid):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": "then"}))


@pytest.fixture
def lock_holder(tmp_path):
    """A second process holding the lock of `tmp_path / "out"` until the test ends: `(folder, pid)`."""
    folder = tmp_path / "out"
    script = textwrap.dedent(f"""
        import sys
        from haste_hf.run_lock import output_dir_lock
        with output_dir_lock({str(folder)!r}):
            print("held", flush=True)
            sys.stdin.read()
    """)  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert process.stdout.readline().strip() == "held"
    yield folder, process.pid
    process.stdin.close()
    assert process.wait(timeout=60) == 0


def test_a_second_train_into_a_folder_being_trained_into_is_refused_before_anything_loads(capsys, cli_files, encoder_dir, lock_holder, monkeypatch):
    import haste_hf.recipe

    folder, pid = lock_holder
    monkeypatch.setattr(haste_hf.recipe, "load_dataset", lambda *args: pytest.fail("the data was loaded"))
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert_one_line_error(status, lines, 1, "train", str(folder), f"process {pid} on host {socket.gethostname()}", "--output-dir")
    assert os.listdir(folder) == [LOCK_FILE]  # the holder's lock, untouched


def test_a_lock_file_of_a_live_process_is_refused_and_one_of_an_ended_process_taken_over(tmp_path):
    import haste_hf.run_lock

    folder = tmp_path / "out"
    plant_lock(folder, os.getppid())  # alive: the process that started the tests
    with pytest.raises(OutputDirInUseError, match=f"process {os.getppid()} on host"):
        with output_dir_lock(folder):
            pytest.fail("the lock was taken")
    pid = dead_pid()
    plant_lock(folder, pid)
    with CaptureLogger(haste_hf.run_lock.logger) as captured, output_dir_lock(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of process {pid} on host" in captured.out
    assert os.listdir(folder) == []  # released


@pytest.mark.parametrize("error", [ValueError("bad data"), KeyboardInterrupt()])
def test_the_lock_is_released_when_the_run_fails_or_is_interrupted(capsys, cli_files, encoder_dir, tmp_path, monkeypatch, error):
    import haste_hf.recipe

    def fail(*args):
        raise error

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", fail)
    folder = tmp_path / "out"
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert status == (1 if isinstance(error, ValueError) else 130)
    assert not folder.exists()  # neither the lock nor the folder it was made for is left
    with output_dir_lock(folder):  # and a new run takes the folder
        pass


def test_a_finished_run_releases_its_folder(capsys, cli_files, encoder_dir, tmp_path):
    folder = tmp_path / "out"
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert status == 0 and not (folder / LOCK_FILE).exists()
    assert HasteForExtremeClassification.from_pretrained(folder).config.label_count == CLI_LABELS


def test_a_save_keeps_the_staging_folder_of_a_save_running_beside_it(tmp_path):
    host = socket.gethostname()
    running = tmp_path / f"{STAGING_PREFIX}{host}-{os.getppid()}-abcd1234"
    ended = tmp_path / f"{STAGING_PREFIX}{host}-{dead_pid()}-abcd1234"
    for staging in (running, ended):
        staging.mkdir(parents=True)
        (staging / "model.safetensors").write_bytes(b"partial")
    make_model().save_pretrained(tmp_path)
    assert running.is_dir() and not ended.exists()


# ------------------------------------------------------------------------------------- an unwritable output folder


def unwritable_folders(tmp_path):
    """`(folder, fragment of the message)`: a file in the way of the folder or of its parent, and a folder that
    refuses new files (a read-only folder; as root, whom permissions do not stop, the read-only sysfs)."""
    (tmp_path / "file").write_text("")
    cases = [(tmp_path / "file", "is a file"), (tmp_path / "file" / "out", f"cannot be created: {tmp_path / 'file'} is a file")]
    if os.geteuid() == 0:
        cases.append(("/sys/haste-out", "is not writable"))
    else:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        os.chmod(read_only, 0o555)
        cases.append((read_only / "out", "is not writable"))
    return cases


def test_an_unwritable_output_folder_is_refused_before_anything_loads(capsys, cli_files, encoder_dir, tmp_path, monkeypatch):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_dataset", lambda *args: pytest.fail("the data was loaded"))
    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda *args: pytest.fail("the encoder was loaded"))
    for folder, fragment in unwritable_folders(tmp_path):
        status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
        assert_one_line_error(status, lines, 2, "train", "--output-dir", str(folder), fragment)
        with pytest.raises(ValueError, match=fragment):  # the library call too
            haste_hf.recipe.train(cli_files["data"], str(encoder_dir), output_dir=str(folder))
