"""A command that saves over a model (`add-labels` into its own `--model`, `train --overwrite-output-dir` into a
folder that holds one), killed by SIGKILL at points of its saves, leaves a folder that loads as the old model or as
the new one, and that the command runs on again."""

import json
import shutil

import faults
from faults import check_killed_saves, killed_saves, top_labels
from launch import run_cli, train_flags
from transformers import AutoTokenizer


cli_files = faults.cli_files  # the fixture: datasets of 30, 40 and 20 labels, a saved 30-label model, texts


def batch_of(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(["w3 w40 w50", "w7 w60", "w1 w2 w9 w11", "w90 w91"], padding=True, return_tensors="pt")
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def test_add_labels_over_its_own_model_killed_at_any_point_leaves_the_old_or_the_new(tmp_path, cli_files, capsys):
    model = tmp_path / "model"
    shutil.copytree(cli_files["model"], model)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"name": "planted", "text": "w90 w91"}, {"name": "other", "text": "w92"}]))
    batch = batch_of(model)
    old = top_labels(model, batch)
    argv = ["add-labels", "--model", "{folder}", "--labels", str(labels), "--output-dir", "{folder}"]
    result = killed_saves(tmp_path, model, ["cli", *argv, "--overwrite-output-dir"])
    check_killed_saves(tmp_path / "runs", result, old, batch)
    # The first, fourth and twelfth file moved in, the id: the folders the audit found refused.
    files = [point for point in result["killed"] if result["events"][int(point) - 1][0] == "move"]
    assert len(files) >= 6, result["events"]
    again = tmp_path / "runs" / f"killed-{files[3]}"
    labels.write_text(json.dumps([{"name": "third", "text": "w93"}]))
    status, lines = run_cli(capsys, [arg.replace("{folder}", str(again)) for arg in argv] + ["--overwrite-output-dir"])
    assert status == 0, lines
    assert top_labels(again, batch)[1] == 33


def test_training_over_a_model_killed_at_any_point_of_its_saves_leaves_the_old_or_the_new(
    tmp_path, cli_files, encoder_dir
):
    model = tmp_path / "model"
    shutil.copytree(cli_files["model"], model)
    batch = batch_of(model)
    old = top_labels(model, batch)  # 30 labels; the run trains 20
    argv = train_flags(cli_files["data20"], encoder_dir, "{folder}", "--overwrite-output-dir")
    result = killed_saves(tmp_path, model, ["cli", *map(str, argv)])
    assert sum(event == ["move", faults.INCOMPLETE_SAVE_FILE] for event in result["events"]) == 2  # model, results
    check_killed_saves(tmp_path / "runs", result, old, batch)


def test_resuming_a_run_whose_model_gained_labels_since_its_checkpoint_is_refused(
    tmp_path, cli_files, encoder_dir, capsys
):
    """`add-labels` into a run's folder, then `train --resume-from-checkpoint` of its checkpoint: the run's final save
    would put the checkpoint's 30 labels over the 32 of the folder's model, without a word. Refused in one line."""
    from launch import assert_one_line_error

    from haste_hf.modeling.saving import checkpoint_folders

    folder = tmp_path / "run"
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert status == 0, lines
    (checkpoint,) = checkpoint_folders(folder)[-1:]
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"name": "planted", "text": "w90 w91"}, {"name": "other", "text": "w92"}]))
    argv = ["add-labels", "--model", folder, "--labels", labels, "--output-dir", folder, "--overwrite-output-dir"]
    status, lines = run_cli(capsys, argv)
    assert status == 0, lines
    batch = batch_of(folder)
    added = top_labels(folder, batch)
    assert added[1] == 32
    for resume in (checkpoint, "last"):
        status, lines = run_cli(
            capsys, train_flags(cli_files["data"], encoder_dir, folder, "--resume-from-checkpoint", resume)
        )
        assert_one_line_error(status, lines, 1, "train", "32 labels", "30", "add-labels", "--output-dir")
    kept = top_labels(folder, batch)
    assert kept[1] == 32 and (kept[0] == added[0]).all()
