"""Runs a command of several processes (torchrun and its workers) so that none outlives the test.

`subprocess.run(..., timeout=...)` kills the one process it started, and torchrun starts each worker in a session
of its own: workers hung in a collective would go on holding the CPU (and their ports) after the test failed. Here
every process of the command carries a token in its environment (inherited by whatever it starts), and on a
timeout, an error or the command's end each process holding the token is killed.
"""

import contextlib
import os
import signal
import subprocess
import uuid
from pathlib import Path


TOKEN_VARIABLE = "HASTE_TEST_PROCESS_TOKEN"


def processes_holding(token: str) -> list[int]:
    """Ids of the processes whose environment holds `TOKEN_VARIABLE=token` (Linux: /proc)."""
    entry = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    for folder in Path("/proc").glob("[0-9]*"):
        try:
            if entry in (folder / "environ").read_bytes().split(b"\0"):
                found.append(int(folder.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


def kill_all(process: subprocess.Popen, token: str) -> None:
    """SIGKILL to `process`'s session and to every process that holds `token`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in processes_holding(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_whole(command: list[str], *, timeout: float, env=None, **popen_kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True, timeout=timeout)`, except that every process the
    command started is killed when it ends, times out or is interrupted; raises `TimeoutExpired` on a timeout, with
    what the processes printed."""
    token = uuid.uuid4().hex
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**(os.environ if env is None else env), TOKEN_VARIABLE: token},
        **popen_kwargs,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all(process, token)
        stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr) from None
    except BaseException:
        kill_all(process, token)
        process.communicate()
        raise
    kill_all(process, token)  # a worker that outlived torchrun
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
