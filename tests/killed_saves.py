"""Saves over a model, killed by SIGKILL at chosen points of their switch: the writer of the kill tests.

`python killed_saves.py SPEC.json`. SPEC: `folder` (a saved model), `out` (an empty folder), `command` and `points`.
`command` is `["cli", ARG, ...]` (a `haste-hf` command line, `{folder}` standing for the folder it runs on) or
`["save_pretrained", SEED]` (a tiny 30-label model of that seed saved over the folder).

The command first runs to its end on a copy of `folder` (`OUT/new`) in this process, counting the events of its
saves into that folder: each file moved in from a staging folder (the journal and the save's id included), each removal of the
journal and of a staging folder. Then, for each point `k` (`points` is "all" (1..events) or "sample" (see `sample_points`)), it runs on
a fresh copy (`OUT/killed-k`) in a forked child that kills itself just before event `k`. Writes `OUT/events.json`:
the events of the full run (kind and name) and, per point, how the child ended.

The killed runs are children forked from this process after the full run, so that they find every module
imported; torch runs on one thread and the tokenizers without threads, so that forking is safe.
"""

import json
import os
import shutil
import signal
import sys
import traceback


def install_kill_hook(target: str, kill_before: int | None, events: list):
    """Records into `events` the switch events of saves into `target`; kills this process just before event number
    `kill_before` (1-based; None: never)."""
    from haste_hf.modeling.saving import INCOMPLETE_SAVE_FILE, STAGING_PREFIX

    replace, remove, rmtree = os.replace, os.remove, shutil.rmtree

    def event(kind: str, name: str):
        events.append([kind, name])
        if len(events) == kill_before:
            os.kill(os.getpid(), signal.SIGKILL)

    def hooked_replace(source, destination, *args, **kwargs):
        source, destination = os.path.abspath(source), os.path.abspath(destination)
        if os.path.dirname(destination) == target and os.path.basename(os.path.dirname(source)).startswith(
            STAGING_PREFIX
        ):
            event("move", os.path.basename(destination))
        return replace(source, destination, *args, **kwargs)

    def hooked_remove(path, *args, **kwargs):
        if os.path.abspath(path) == os.path.join(target, INCOMPLETE_SAVE_FILE):
            event("remove journal", INCOMPLETE_SAVE_FILE)
        return remove(path, *args, **kwargs)

    def hooked_rmtree(path, *args, **kwargs):
        path = os.path.abspath(path)
        if (
            os.path.dirname(path) == target
            and os.path.basename(path).startswith(STAGING_PREFIX)
            and os.path.isdir(path)
        ):
            event("remove staging", "")
        return rmtree(path, *args, **kwargs)

    os.replace, os.remove, shutil.rmtree = hooked_replace, hooked_remove, hooked_rmtree

    def restore():
        os.replace, os.remove, shutil.rmtree = replace, remove, rmtree

    return restore


def run_command(command: list, folder: str) -> None:
    if command[0] == "cli":
        from haste_hf.cli import main

        status = main([argument.replace("{folder}", folder) for argument in command[1:]])
        if status != 0:
            raise SystemExit(f"the command ended with status {status}")
    else:
        from tiny_haste import make_tiny_model

        model = make_tiny_model(label_count=30, head_label_count=2, seed=command[1])
        model.set_label_names([f"new {i}" for i in range(30)])
        model.save_pretrained(folder)


def run_in_child(command: list, source: str, folder: str, kill_before: int) -> str:
    """How a forked child that runs `command` on a copy of `source` at `folder`, killed before event `kill_before`,
    ended."""
    shutil.copytree(source, folder, symlinks=True)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            install_kill_hook(os.path.abspath(folder), kill_before, [])
            run_command(command, folder)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"


def sample_points(events: list) -> list[int]:
    """Of each save: the journal, the 1st, 4th and 12th file moved in, the last one, the id, the removal of the
    journal and of the staging folder (1-based event numbers)."""
    from haste_hf.modeling.saving import INCOMPLETE_SAVE_FILE, SAVE_GENERATION_FILE

    points, files = [], []
    for number, (kind, name) in enumerate(events, start=1):
        if kind == "move" and name == INCOMPLETE_SAVE_FILE:
            files = []
            points.append(number)
        elif kind == "move" and name == SAVE_GENERATION_FILE:
            points += [files[i] for i in sorted({0, 3, 11, len(files) - 1}) if 0 <= i < len(files)]
            points.append(number)
        elif kind == "move":
            files.append(number)
        else:
            points.append(number)
    return points


def main(spec_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    with open(spec_path) as f:
        spec = json.load(f)
    out, command = spec["out"], spec["command"]
    # The full run in this process: the children forked after it find every module it needed imported.
    folder = os.path.join(out, "new")
    shutil.copytree(spec["folder"], folder, symlinks=True)
    events = []
    restore = install_kill_hook(os.path.abspath(folder), None, events)
    run_command(command, folder)
    restore()
    points = {"all": range(1, len(events) + 1), "sample": sample_points(events)}[spec["points"]]
    killed = {
        point: run_in_child(command, spec["folder"], os.path.join(out, f"killed-{point}"), point) for point in points
    }
    with open(os.path.join(out, "events.json"), "w") as f:
        json.dump({"events": events, "killed": killed}, f)


if __name__ == "__main__":
    main(sys.argv[1])
