"""The run folder's owner (`haste_hf.training.run_folder.RunFolder`): what it refuses, what it clears, what it holds."""

import pytest

from haste_hf.training.run_folder import RunFolder
from haste_hf.training.run_lock import LOCK_FILE


def finished_run(folder):
    """A folder as a finished run leaves it: a model and a checkpoint."""
    (folder / "checkpoint-4").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_a_folder_holding_a_model_is_refused_unless_overwritten_or_resumed(tmp_path):
    folder = finished_run(tmp_path / "out")
    with pytest.raises(ValueError, match=r"already holds a model \(config.json, checkpoint-4\)"):
        RunFolder(folder).check()
    RunFolder(folder, overwrite=True).check()
    RunFolder(folder, resume=True).check()
    with pytest.raises(ValueError, match="not both"):
        RunFolder(folder, overwrite=True, resume=True).check()
    RunFolder(tmp_path / "new").check()  # a folder to be made is fine, and is not made by checking
    assert not (tmp_path / "new").exists()


def test_the_refusal_names_up_to_four_things_the_folder_holds(tmp_path):
    folder = finished_run(tmp_path / "out")
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "checkpoint-8").mkdir()
    with pytest.raises(ValueError, match=r"\(config.json, model.safetensors, checkpoint-4, checkpoint-8\): pass"):
        RunFolder(folder).check()
    (folder / "checkpoint-12").mkdir()
    with pytest.raises(ValueError, match=r"\(config.json, model.safetensors, checkpoint-4, checkpoint-8, ...\): pass"):
        RunFolder(folder).check()


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "out").write_text("")
    with pytest.raises(ValueError, match="is a file; give a folder path"):
        RunFolder(tmp_path / "out").check()


@pytest.mark.parametrize(
    ("overwrite", "resume", "cleared"), [(True, False, True), (True, True, False), (False, False, False)]
)
def test_checkpoints_are_cleared_only_when_the_run_starts_afresh_over_them(tmp_path, overwrite, resume, cleared):
    folder = finished_run(tmp_path / "out")
    RunFolder(folder, overwrite=overwrite, resume=resume).clear_checkpoints()
    assert (folder / "checkpoint-4").exists() is not cleared
    assert (folder / "config.json").exists()  # the model is replaced by the new save, not cleared


def test_the_main_process_holds_the_folder_and_the_others_leave_it_alone(tmp_path):
    folder = tmp_path / "out"
    with RunFolder(folder).held(is_main=True):
        assert (folder / LOCK_FILE).is_file()
    assert not folder.exists()  # made for the lock and left empty: removed again
    with RunFolder(folder).held(is_main=False):
        assert not folder.exists()


def test_results_added_later_join_the_saved_folder(tmp_path):
    folder = finished_run(tmp_path / "out")
    RunFolder(folder).add_files(lambda staging: (staging / "test_metrics.json").write_text('{"P@1": 1.0}'))
    assert (folder / "test_metrics.json").read_text() == '{"P@1": 1.0}' and (folder / "config.json").exists()


@pytest.mark.parametrize("is_main", [True, False])
def test_the_trained_model_is_saved_by_the_main_process_only(tmp_path, is_main):
    from types import SimpleNamespace

    from tiny_haste import make_tiny_model

    trainer = SimpleNamespace(
        model=make_tiny_model(),
        args={"seed": 0},
        state=SimpleNamespace(global_step=4),
        is_world_process_zero=lambda: is_main,
    )
    folder = tmp_path / "out"
    RunFolder(folder).save_trained(trainer, None, lambda staging: (staging / "card.md").write_text("card"))
    if is_main:
        assert {"config.json", "model.safetensors", "training_args.bin", "card.md"} <= {
            p.name for p in folder.iterdir()
        }
    else:
        assert not folder.exists()  # the other ranks leave the folder to the main one
