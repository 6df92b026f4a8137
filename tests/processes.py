"""Child processes of the tests that end whatever happens: a pass, a failure, a timeout or an interrupt.

Every command runs in a session of its own (a process group led by the child), so the processes it starts
(torchrun's ranks, a server's workers) can be ended together; the group is killed when the command returns, when
it outlives its timeout and when the test session ends. Output goes to files, not pipes: a rank that outlives its
launcher cannot hold the test waiting for the end of a pipe.
"""

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


TESTS = Path(__file__).parent
_live_groups: set[int] = set()


def _ask_for_sigterm_when_parent_dies():
    """Runs in the child before it starts: Linux sends it SIGTERM when the test process dies, even by SIGKILL;
    torchrun ends its ranks on SIGTERM."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_group(pid: int) -> None:
    """Kills the process `pid`, every process it started (torchrun puts each rank in a session of its own) and
    every process of their groups."""
    for member in [pid, *descendants(pid)]:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(member, signal.SIGKILL)
    _live_groups.discard(pid)


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs, still alive (read from /proc: empty where there is none)."""
    children = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            state, parent = entry.read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                children.setdefault(int(parent), []).append(int(entry.parent.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def python_stacks(pid: int) -> str:
    """Where `pid` and the processes it started are, as `py-spy dump` shows it (when py-spy is installed): what a
    hang's report needs."""
    if shutil.which("py-spy") is None:
        return "(install py-spy to see where the processes were)"
    dumps = []
    for member in [pid, *descendants(pid)]:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            dump = subprocess.run(["py-spy", "dump", "--pid", str(member)], capture_output=True, text=True, timeout=60)
            dumps.append(f"--- process {member}\n{dump.stdout}{dump.stderr}")
    return "\n".join(dumps)


def start(command, *, stdout=None, stderr=None, **popen) -> subprocess.Popen:
    """`subprocess.Popen(command)` in a new session, registered to be killed at the end of the test session."""
    process = subprocess.Popen(
        command,
        start_new_session=True,
        preexec_fn=_ask_for_sigterm_when_parent_dies,
        stdout=stdout,
        stderr=stderr,
        **popen,
    )
    _live_groups.add(process.pid)
    return process


def run(command, *, timeout: float, check: bool = True, **popen) -> subprocess.CompletedProcess:
    """Runs `command` to its end, or kills its whole group at `timeout` seconds and fails the test with the end of
    its output. Its group is killed on return in every case. Returns the status, stdout and stderr (text); with
    `check`, a non-zero status fails the test."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = start(command, stdout=out, stderr=err, text=True, **popen)
        stacks = ""
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            returncode, stacks = None, python_stacks(process.pid)
        finally:
            kill_group(process.pid)
            process.wait()
        out.seek(0), err.seek(0)
        result = subprocess.CompletedProcess(command, returncode, out.read(), err.read())
    if returncode is None:
        raise AssertionError(
            f"{' '.join(map(str, command))} ran past {timeout} s and was killed:\n{result.stderr[-6000:]}\n{stacks}"
        )
    if check and returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited with {returncode}:\n{result.stderr[-6000:]}")
    return result


def child_environment() -> dict:
    """This process's environment (the test Hub's included) with the tests' modules on the path, one thread each."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }


def torchrun(script_arguments, cwd, processes: int = 2, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc_per_node N ARGS` on the CPU with the tests' modules on
    the path; `run`'s guarantees: every rank ends with it."""
    env = child_environment()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    return run([*command, *map(str, script_arguments)], timeout=timeout, env=env, cwd=cwd)


@atexit.register
def _kill_live_groups():
    for pid in list(_live_groups):
        kill_group(pid)
