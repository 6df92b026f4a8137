"""Saving and loading faults: a save never leaves a half-written folder, and loading refuses what a
killed or corrupted save left."""

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch
from faults import assert_no_leftovers, check_killed_saves, corrupt, folder_state, killed_saves, make_model, top_labels
from tiny_encoders import tiny_tokenizer
from transformers import PreTrainedModel

import haste_hf.hub
from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import (
    INCOMPLETE_SAVE_FILE,
    STAGING_PREFIX,
    atomic_path,
    save_folder_atomically,
)


# ------------------------------------------------------------------------------------- saving and loading


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield 0o640  # what `open` gives a new file under it
    os.umask(previous)


def test_a_file_written_whole_gets_the_mode_of_a_new_file(tmp_path, umask_027):
    """`atomic_path` (predictions, metrics, label layouts) gave 0o600, `tempfile.mkstemp`'s mode: the user's group
    could not read what the commands wrote."""
    path = tmp_path / "top5.jsonl"
    with atomic_path(path) as partial:
        assert stat.S_IMODE(os.stat(partial).st_mode) == umask_027
        Path(partial).write_text("{}\n")
    assert stat.S_IMODE(path.stat().st_mode) == umask_027 and path.read_text() == "{}\n"
    assert [entry.name for entry in tmp_path.iterdir()] == ["top5.jsonl"]
    with pytest.raises(RuntimeError), atomic_path(path) as partial:
        Path(partial).write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "{}\n" and [entry.name for entry in tmp_path.iterdir()] == ["top5.jsonl"]


def test_save_into_a_writable_folder_under_a_read_only_parent(tmp_path, monkeypatch):
    target = tmp_path / "volume" / "model"
    target.mkdir(parents=True)
    # Permissions do not bind root (CI may run as root): also check that nothing appears in the parent.
    parent_listings = []
    write = PreTrainedModel.save_pretrained

    def watched(self, directory, *args, **kwargs):
        result = write(self, directory, *args, **kwargs)
        parent_listings.append(sorted(os.listdir(tmp_path / "volume")))
        return result

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", watched)
    os.chmod(tmp_path / "volume", stat.S_IRUSR | stat.S_IXUSR)
    try:
        model = make_model()
        model.save_pretrained(target)
        model.save_pretrained(target)  # and again over the first save
    finally:
        os.chmod(tmp_path / "volume", stat.S_IRWXU)
    assert parent_listings == [["model"], ["model"]]
    assert_no_leftovers(target)
    assert torch.equal(
        HasteForExtremeClassification.from_pretrained(target).output_layer.tail.weight, model.output_layer.tail.weight
    )


def test_failed_write_leaves_the_previous_save_and_no_staging(tmp_path):
    make_model(seed=0).save_pretrained(tmp_path)
    before = folder_state(tmp_path)

    def write(staging):
        with open(os.path.join(staging, "config.json"), "w") as file:
            file.write("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_folder_atomically(tmp_path, write)
    assert folder_state(tmp_path) == before


def test_a_save_over_a_model_killed_at_any_point_loads_as_the_old_or_the_new(tmp_path):
    """SIGKILL before each file moved in, the journal, the id, the journal's and the staging folder's removal: the
    folder loads as the old model (killed before the journal) or the new one (after it: the load finishes the switch)."""
    old_model = make_model(label_count=30, head_label_count=2, seed=0, fan_in=4)
    old_model.save_pretrained(tmp_path / "model")
    batch = {"input_ids": torch.randint(5, 100, (6, 9), generator=torch.Generator().manual_seed(0))}
    old = top_labels(tmp_path / "model", batch)
    result = killed_saves(tmp_path, tmp_path / "model", ["save_pretrained", 1], points="all")
    assert len(result["killed"]) >= 8, result["events"]  # every file of the save, each mark, the staging folder
    check_killed_saves(tmp_path / "runs", result, old, batch)


def test_a_save_stopped_by_an_error_while_its_files_move_in_is_finished_by_the_next_load(tmp_path, monkeypatch):
    """An interrupt after the first file moved in: the load finishes the switch at once, the folder holds the new
    save whole."""
    make_model(seed=0).save_pretrained(tmp_path)
    moved = []
    replace = os.replace

    def replace_then_stop(source, destination):
        if len(moved) == 2:  # the journal, a file, then stopped
            raise KeyboardInterrupt
        moved.append(destination)
        replace(source, destination)

    new = make_model(seed=1, fan_in=4)
    monkeypatch.setattr(os, "replace", replace_then_stop)
    with pytest.raises(KeyboardInterrupt):
        new.save_pretrained(tmp_path)
    monkeypatch.setattr(os, "replace", replace)
    assert (tmp_path / INCOMPLETE_SAVE_FILE).exists()
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path)
    assert loaded.config.fan_in == 4 and torch.equal(loaded.output_layer.tail.weight, new.output_layer.tail.weight)
    assert_no_leftovers(tmp_path)


def test_an_interrupted_save_that_cannot_be_finished_for_want_of_write_access_is_refused_saying_so(
    tmp_path, monkeypatch
):
    """A load that must finish a stopped switch in a folder it may not write to says so (root writes anywhere: the
    refusal of the move is made here), instead of loading a folder that mixes two saves."""
    from haste_hf.modeling import saving

    make_model(seed=0).save_pretrained(tmp_path)
    moved, replace = [], os.replace

    def replace_then_stop(source, destination):
        if len(moved) == 2:
            raise KeyboardInterrupt
        moved.append(destination)
        replace(source, destination)

    monkeypatch.setattr(os, "replace", replace_then_stop)
    with pytest.raises(KeyboardInterrupt):
        make_model(seed=1, fan_in=4).save_pretrained(tmp_path)
    monkeypatch.setattr(os, "replace", replace)

    def refused(target, journal):
        raise PermissionError(13, "Permission denied", target)

    monkeypatch.setattr(saving, "_switch_in", refused)
    with pytest.raises(
        OSError, match=r"stopped while its files moved in; finishing it needs write access \(Permission"
    ):
        saving.finish_interrupted_save(tmp_path)
    assert (tmp_path / INCOMPLETE_SAVE_FILE).exists()


def test_a_mark_without_a_journal_to_finish_is_refused_at_load_and_repaired_by_a_save(tmp_path):
    """A mark of a version that wrote no journal (or one whose staging folder is gone) cannot be finished."""
    make_model(seed=0).save_pretrained(tmp_path)
    (tmp_path / INCOMPLETE_SAVE_FILE).write_text(json.dumps({"files": ["config.json"]}))
    with pytest.raises(OSError, match="interrupted save"):
        HasteForExtremeClassification.from_pretrained(tmp_path)
    make_model(seed=1, fan_in=4).save_pretrained(tmp_path)
    assert_no_leftovers(tmp_path)
    assert HasteForExtremeClassification.from_pretrained(tmp_path).config.fan_in == 4


def test_a_push_of_an_interrupted_save_is_refused(tmp_path):
    make_model().save_pretrained(tmp_path)
    (tmp_path / INCOMPLETE_SAVE_FILE).write_text("{}")
    with pytest.raises(OSError, match="interrupted save"):
        haste_hf.hub.push_to_hub(tmp_path, "user/model")


@pytest.mark.parametrize("name", ["killed", "{host}-notapid-abcd1234", "4242-abcd1234", "-4242-abcd1234"])
def test_leftover_staging_of_a_killed_save_is_removed_by_the_next_save(tmp_path, name):
    """A staging folder whose name gives no host and process id (an older version's, a damaged name) is a leftover;
    one of another host is kept (its save may still run: this host cannot ask)."""
    import socket

    make_model().save_pretrained(tmp_path)
    leftover = tmp_path / f"{STAGING_PREFIX}{name.format(host=socket.gethostname())}"
    other_host = tmp_path / f"{STAGING_PREFIX}not-{socket.gethostname()}-4242-abcd1234"
    for staging in (leftover, other_host):
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(b"partial")
    make_model().save_pretrained(tmp_path)
    assert not leftover.exists() and other_host.is_dir()
    shutil.rmtree(other_host)
    assert_no_leftovers(tmp_path)


def test_save_into_a_file_path_is_refused(tmp_path):
    path = tmp_path / "model"
    path.write_text("not a folder")
    with pytest.raises(ValueError, match="is a file"):
        make_model().save_pretrained(path)
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize(
    "where", ["output_layer.tail.weight", "output_layer.head.bias", "encoder.embeddings.word_embeddings.weight"]
)
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_never_saved(tmp_path, where, value):
    model = make_model()
    with torch.no_grad():
        model.get_parameter(where).view(-1)[3] = value
    with pytest.raises(ValueError, match=f"non-finite.*{where}"):
        model.save_pretrained(tmp_path / "model")
    assert not (tmp_path / "model" / "model.safetensors").exists()


def test_large_finite_weights_are_saved(tmp_path):
    model = make_model()
    with torch.no_grad():
        model.output_layer.tail.weight.fill_(1e30)  # the squared norm overflows; the values do not
    model.save_pretrained(tmp_path)
    assert HasteForExtremeClassification.from_pretrained(tmp_path).output_layer.tail.weight.max() == 1e30


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("output_layer.tail.supports", lambda t: t.__setitem__((0, 0), 32), "outside \\[0, 32\\)"),
        ("output_layer.tail.supports", lambda t: t.__setitem__((2, 1), -5), "outside \\[0, 32\\)"),
        ("output_layer.tail.supports", lambda t: t.__setitem__((1, 1), t[1, 0]), "group 1 lists a feature twice"),
        ("output_layer.output_labels", lambda t: t.__setitem__(0, t[1]), "each of the 40 labels exactly once"),
        ("output_layer.output_labels", lambda t: t.__setitem__(5, 40), "each of the 40 labels exactly once"),
        ("output_layer.output_labels", lambda t: t.__setitem__(5, -7), "each of the 40 labels exactly once"),
    ],
)
def test_corrupt_weights_file_is_refused_at_load(tmp_path, name, change, message):
    make_model().save_pretrained(tmp_path)
    corrupt(tmp_path, name, change)
    with pytest.raises(ValueError, match=message):
        HasteForExtremeClassification.from_pretrained(tmp_path)


def test_save_pretrained_pushes_to_the_folders_name_not_the_staging_folder(tmp_path, monkeypatch):
    pushed = []
    monkeypatch.setattr(haste_hf.hub, "push_to_hub", lambda model, repo_id, **kwargs: pushed.append((repo_id, kwargs)))
    model = make_model()
    model.save_pretrained(tmp_path / "my-model", push_to_hub=True, private=True)
    model.save_pretrained(tmp_path / "other", push_to_hub=True, repo_id="user/named")
    assert pushed == [("my-model", {"private": True}), ("user/named", {})]
    assert (tmp_path / "my-model" / "model.safetensors").exists()


MARK_CASES = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # reading /dev/zero fails fast instead of filling the host
from haste_hf import HasteForExtremeClassification
from haste_hf.onnx_serving import OnnxClassifier
results = {}
for folder in sys.argv[1:]:
    load = OnnxClassifier if folder.endswith("-onnx") else HasteForExtremeClassification.from_pretrained
    try:
        load(folder)
        results[folder] = "loaded"
    except BaseException as error:
        results[folder] = f"{type(error).__name__}: {error}"
print(json.dumps(results))
"""


def test_a_mark_that_is_not_a_small_regular_file_is_refused_at_load_in_one_line(tmp_path):
    """A FIFO at a mark's name would block every load forever, a link to /dev/zero fill the memory: each is refused
    at once, in one line naming it (a model folder's marks, and an ONNX export's id)."""
    import sys

    import processes

    from haste_hf.export import export_onnx
    from haste_hf.modeling.saving import SAVE_GENERATION_FILE

    source = tmp_path / "model"
    make_model().save_pretrained(source)
    folders, marks = [], {}
    for mark in (INCOMPLETE_SAVE_FILE, SAVE_GENERATION_FILE):
        for kind in ("fifo", "link to /dev/zero", "oversized"):
            folder = tmp_path / f"{len(folders)}"
            shutil.copytree(source, folder)
            path = folder / mark
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if kind == "fifo":
                os.mkfifo(path)
            elif kind == "link to /dev/zero":
                path.symlink_to("/dev/zero")
            else:
                path.write_text(json.dumps({"generation": "x" * (2 << 20)}))
            folders.append(str(folder))
            marks[str(folder)] = (path, kind)
    tiny_tokenizer(source)
    exported = tmp_path / "export-onnx"
    export_onnx(str(source), exported, top_k=3)
    (exported / SAVE_GENERATION_FILE).unlink()
    os.mkfifo(exported / SAVE_GENERATION_FILE)
    folders.append(str(exported))
    marks[str(exported)] = (exported / SAVE_GENERATION_FILE, "fifo")
    # A load blocked on a mark fails the test at the timeout, with the stacks of the process.
    result = processes.run([sys.executable, "-c", MARK_CASES, *folders], timeout=180, env=processes.child_environment())
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    for folder, outcome in outcomes.items():
        path, kind = marks[folder]
        assert outcome.startswith(("OSError", "ExportError")), (kind, outcome[:300])
        assert str(path) in outcome and "\n" not in outcome, (kind, outcome[:300])


def test_where_folders_cannot_be_locked_the_journals_owner_decides_whether_a_save_goes_on(tmp_path):
    """`_wait_for_running_save` (no `flock`: Windows, some network file systems): no journal, or one of this process
    or of a process of this host that is gone, lets the save go on; one of another host, of a process still running
    past the wait, or a mark that cannot be read (a FIFO) does not, at once for the last."""
    import socket
    import subprocess
    import sys
    import time

    from haste_hf.modeling.saving import _wait_for_running_save

    mark = tmp_path / INCOMPLETE_SAVE_FILE

    def journal_of(host, pid):
        mark.write_text(json.dumps({"host": host, "pid": pid, "staging": f"{STAGING_PREFIX}x", "files": []}))

    assert _wait_for_running_save(str(tmp_path), 0.05)
    journal_of(socket.gethostname(), os.getpid())
    assert _wait_for_running_save(str(tmp_path), 0.05)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    journal_of(socket.gethostname(), int(ended.stdout))
    assert _wait_for_running_save(str(tmp_path), 0.05)
    journal_of("another-host", os.getpid())
    assert not _wait_for_running_save(str(tmp_path), 0.05)
    journal_of(socket.gethostname(), os.getppid())  # running, and past the wait
    assert not _wait_for_running_save(str(tmp_path), 0.05)
    mark.unlink()
    os.mkfifo(mark)
    start = time.monotonic()
    assert not _wait_for_running_save(str(tmp_path), None)  # no wait would end
    assert time.monotonic() - start < 5


@pytest.mark.parametrize(
    "value, is_pid", [(1, True), (4321, True), (0, False), (-3, False), (True, False), ("7", False)]
)
def test_a_journals_owner_is_a_pid_only_as_a_positive_integer(value, is_pid):
    from haste_hf.modeling.saving import _is_pid

    assert _is_pid(value) is is_pid
