# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Which commit a benchmark ran, and where that was read (stdlib only; `distributed.py` and `scale.py` load it by
path).

A copy of the tree can run inside another checkout (the device's copy of a worktree is an ignored folder of the
main checkout): git's HEAD there is the outer checkout's, not the tree's. `HASTE_COMMIT` names the tree's commit;
without it, git's HEAD is trusted only where git's top level is this tree's own root.
"""

import os
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def tree_commit() -> str:
    """`"<commit> (HASTE_COMMIT)"`, `"<commit> (git HEAD[, uncommitted changes])"`, or `"unknown (...)"` saying why."""
    if os.environ.get("HASTE_COMMIT"):
        return f"{os.environ['HASTE_COMMIT']} (HASTE_COMMIT)"
    try:
        top, head = Path(_git("rev-parse", "--show-toplevel")).resolve(), _git("rev-parse", "--short", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no HASTE_COMMIT, and no git checkout here)"
    if top != ROOT:
        return f"unknown (no HASTE_COMMIT; git's HEAD {head} is of {top}, a checkout around this tree)"
    return f"{head} (git HEAD{', uncommitted changes' if dirty else ''})"
