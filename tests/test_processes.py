"""The tests' launcher (tests/processes.py) ends every process it started: on a timeout, and when the command
ends before the processes it started."""

import sys
import textwrap
import time
from pathlib import Path

import pytest
from processes import run, torchrun


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended; only its parent's wait is missing


def wait_for_pid_files(folder, count: int, seconds: float = 120) -> list[int]:
    deadline = time.monotonic() + seconds
    while True:
        files = sorted(folder.glob("pid-*"))
        if len(files) == count and all(path.read_text() for path in files):
            return [int(path.read_text()) for path in files]
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} processes did not start in {seconds} s")
        time.sleep(0.2)


def assert_ended(pids: list[int], seconds: float = 10):
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if alive(pid)], "processes outlived the test's launcher"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_that_never_end_are_killed_at_the_timeout(tmp_path):
    """The shape of the CI hang: the ranks outlive their work. The test fails at its timeout, with no rank left."""
    script = tmp_path / "forever.py"
    script.write_text(
        textwrap.dedent(f"""
            import os, time
            open(os.path.join({str(tmp_path)!r}, "pid-" + os.environ["RANK"]), "w").write(str(os.getpid()))
            time.sleep(600)
        """)
    )
    started = time.monotonic()
    with pytest.raises(AssertionError, match="ran past 60 s"):
        torchrun([script], tmp_path, timeout=60)
    assert time.monotonic() - started < 120
    assert_ended(wait_for_pid_files(tmp_path, 2, seconds=0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_left_behind_neither_holds_the_test_nor_survives_it(tmp_path):
    """A child that exits while its own child runs on with the output open: the launcher returns at once."""
    script = textwrap.dedent(f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(tmp_path / "pid-0")!r}, "w").write(str(child.pid))
        print("started")
    """)
    started = time.monotonic()
    result = run([sys.executable, "-c", script], timeout=60)
    assert time.monotonic() - started < 30 and result.stdout == "started\n"
    assert_ended(wait_for_pid_files(tmp_path, 1, seconds=0))
