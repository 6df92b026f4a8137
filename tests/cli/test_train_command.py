"""The train command's faults: output folders it refuses or replaces, checkpoints and resumes, runs that
diverge, and data that does not fit."""

import json

import faults
import pytest
import torch
from faults import CLI_LABELS, assert_no_leftovers, folder_state, poison_encoder_output
from launch import assert_one_line_error, run_cli, train_flags
from safetensors.torch import load_file
from tiny_encoders import planted_texts

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import (
    checkpoint_is_complete,
)


cli_files = faults.cli_files  # the fixture: datasets of 30, 40 and 20 labels, a saved model, texts


# ------------------------------------------------------------------------------------------- the train command


def test_training_into_a_folder_holding_a_model_is_refused_and_leaves_it_untouched(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))[0] == 0
    before = folder_state(output)
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))
    assert_one_line_error(
        status,
        lines,
        2,
        "train",
        "--output-dir",
        "already holds a model",
        "--overwrite-output-dir",
        "--resume-from-checkpoint",
    )
    assert folder_state(output) == before


def test_overwrite_output_dir_replaces_the_model_and_the_previous_runs_checkpoints(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--epochs", "2"))[0] == 0
    assert [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-6"]
    # A limit of 2 would keep the old run's checkpoint-6 beside the new checkpoint-3, were it not removed.
    status, _ = run_cli(
        capsys,
        train_flags(
            cli_files["data"],
            encoder_dir,
            output,
            *flags,
            "--overwrite-output-dir",
            "--fan-in",
            "4",
            "--save-total-limit",
            "2",
        ),
    )
    assert status == 0 and [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-3"]
    assert HasteForExtremeClassification.from_pretrained(output).config.fan_in == 4
    assert_no_leftovers(output)


def test_checkpoints_are_written_without_a_validation_split(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, "--validation-fraction", "0"))[0] == 0
    assert [path.name for path in output.glob("checkpoint-*")] == ["checkpoint-3"]  # each epoch, the last kept
    assert checkpoint_is_complete(output / "checkpoint-3")


@pytest.mark.parametrize("strategy", ["steps", "no"])
def test_any_save_strategy_works_without_a_validation_split(capsys, cli_files, encoder_dir, tmp_path, strategy):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0", "--save-strategy", strategy, "--save-steps", "2")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags))[0] == 0
    assert sorted(path.name for path in output.glob("checkpoint-*")) == (
        ["checkpoint-3"] if strategy == "steps" else []
    )
    assert (output / "config.json").exists()


def test_resume_from_checkpoint_continues_the_run_past_a_half_written_checkpoint(
    capsys, cli_files, encoder_dir, tmp_path
):
    output = tmp_path / "out"
    flags = ("--validation-fraction", "0", "--epochs", "2", "--logging-steps", "1")
    assert run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--max-steps", "4"))[0] == 0
    killed = output / "checkpoint-6"
    killed.mkdir()
    (killed / "config.json").write_text("{}")
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output, *flags, "--resume-from-checkpoint"))
    state = json.loads((output / "checkpoint-6" / "trainer_state.json").read_text())
    assert status == 0 and state["global_step"] == 6
    assert [log["step"] for log in state["log_history"] if "loss" in log][:4] == [1, 2, 3, 4]  # from the first run


def test_resume_from_a_named_incomplete_checkpoint_is_a_one_line_error(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    (output / "checkpoint-2").mkdir(parents=True)
    status, lines = run_cli(
        capsys, train_flags(cli_files["data"], encoder_dir, output, "--resume-from-checkpoint", output / "checkpoint-2")
    )
    assert_one_line_error(status, lines, 1, "train", "checkpoint-2 is not a complete checkpoint")


def test_resume_and_overwrite_together_are_refused(capsys, tmp_path):
    status, lines = run_cli(
        capsys, ["train", "--overwrite-output-dir", "--resume-from-checkpoint", "--output-dir", tmp_path]
    )
    assert_one_line_error(status, lines, 2, "train", "--overwrite-output-dir", "not both")


def test_a_failed_test_evaluation_keeps_the_trained_model(capsys, cli_files, encoder_dir, tmp_path, monkeypatch):
    import haste_hf.recipe

    def fail(*args, **kwargs):
        raise ValueError("evaluation failed")

    monkeypatch.setattr(haste_hf.recipe, "evaluate_split", fail)
    output = tmp_path / "out"
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, output))
    assert_one_line_error(status, lines, 1, "train", "evaluation failed")
    model = HasteForExtremeClassification.from_pretrained(output)
    assert model.config.label_count == CLI_LABELS and (output / "tokenizer_config.json").exists()
    assert (output / "README.md").exists() and not (output / "test_metrics.json").exists()
    assert_no_leftovers(output)


def test_a_dataset_of_fewer_labels_than_the_summary_k_trains_and_evaluates(capsys, encoder_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = planted_texts(3, 24, seed=0, labels_per_text=1)
    for name in ("trn.json", "tst.json"):
        (data / name).write_text(
            "".join(
                json.dumps({"uid": str(i), "title": r["text"], "target_ind": r["labels"]}) + "\n"
                for i, r in enumerate(rows)
            )
        )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(3)))
    output = tmp_path / "out"
    status, lines = run_cli(capsys, train_flags(data, encoder_dir, output, "--group-size", "2", "--fan-in", "4"))
    metrics = json.loads((output / "test_metrics.json").read_text())
    assert status == 0 and {"P@1", "P@3"} <= set(metrics) and "P@5" not in metrics


def test_data_without_any_positive_label_is_refused_before_the_encoder_loads(
    capsys, encoder_dir, tmp_path, monkeypatch
):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda name: pytest.fail("the encoder was loaded"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "trn.json").write_text(
        "".join(json.dumps({"uid": str(i), "title": f"w{i}", "target_ind": []}) + "\n" for i in range(8))
    )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(5)))
    status, lines = run_cli(capsys, train_flags(data, encoder_dir, tmp_path / "out"))
    assert_one_line_error(status, lines, 1, "train", "has no positive label")
    assert not (tmp_path / "out").exists()


def test_a_diverging_run_is_a_one_line_error_and_saves_no_final_model(capsys, cli_files, encoder_dir, tmp_path):
    output = tmp_path / "out"
    status, lines = run_cli(
        capsys,
        train_flags(
            cli_files["data"],
            encoder_dir,
            output,
            "--lr",
            "1e8",
            "--output-lr",
            "1e8",
            "--validation-fraction",
            "0",
            "--epochs",
            "20",
        ),
    )
    # Stopped at the first non-finite gradient, or at a checkpoint of weights that already overflowed.
    assert_one_line_error(status, lines, 1, "train", "diverged", "on_non_finite")
    assert not (output / "config.json").exists()
    for checkpoint in output.glob("checkpoint-*"):
        assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())


@pytest.mark.parametrize("poisoned, skipped, steps", [({1, 2}, 2, 3), ({2}, 1, 3)])
def test_a_run_with_skipped_steps_reports_them_and_is_not_saved_when_most_were(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch, poisoned, skipped, steps
):
    import haste_hf.recipe

    build_model = haste_hf.recipe.build_model

    def poisoned_model(*args, **kwargs):
        model = build_model(*args, **kwargs)
        poison_encoder_output(model, calls=poisoned)  # training forward passes: no validation split
        return model

    monkeypatch.setattr(haste_hf.recipe, "build_model", poisoned_model)
    from haste_hf.cli import main

    output = tmp_path / "out"
    # No label-text init: its encoder passes would take the poisoned calls meant for the training steps.
    flags = train_flags(cli_files["data"], encoder_dir, output, "--on-non-finite", "skip", "--validation-fraction", "0")
    flags.append("--no-init-from-label-texts")
    if 2 * skipped > steps:
        status, lines = run_cli(capsys, flags)
        assert_one_line_error(
            status, lines, 1, "train", f"{skipped} of its {steps} optimizer steps were skipped", "not saved"
        )
        assert not (output / "config.json").exists()
    else:
        assert main([str(flag) for flag in flags]) == 0
        assert f"steps: {steps} ({skipped} skipped: NaN or infinite gradients)" in capsys.readouterr().out
        assert (output / "config.json").exists()


@pytest.mark.parametrize("data", ["data40", "data20"])
def test_a_layout_of_another_label_count_is_refused_naming_both_counts(capsys, cli_files, encoder_dir, tmp_path, data):
    layout = tmp_path / "layout.safetensors"
    status, _ = run_cli(
        capsys,
        [
            "group",
            "--data",
            cli_files["data"],
            "--encoder",
            encoder_dir,
            "--output",
            layout,
            "--group-size",
            "4",
            "--grouping",
            "frequency",
            "--max-length",
            "16",
        ],
    )
    assert status == 0
    status, lines = run_cli(
        capsys, train_flags(cli_files[data], encoder_dir, tmp_path / "out", "--layout-file", layout)
    )
    count = data.removeprefix("data")
    assert_one_line_error(
        status, lines, 1, "train", f"layout is of 30 labels and the dataset has {count}", "haste-hf group"
    )
    assert not (tmp_path / "out").exists()


def test_the_demo_replaces_its_own_folder_and_train_does_not():
    from haste_hf.cli.parser import build_parser

    assert build_parser(command="demo").parse_args(["demo"]).overwrite_output_dir is True
    assert build_parser(command="train").parse_args(["train"]).overwrite_output_dir is False


def test_a_config_file_that_does_not_parse_is_a_one_line_error(capsys, tmp_path):
    for name, text in (("run.yaml", "learning_rate: [1\n"), ("run.json", "{learning_rate: 1}")):
        (tmp_path / name).write_text(text)
        status, lines = run_cli(capsys, ["train", "--config", tmp_path / name])
        assert_one_line_error(status, lines, 2, "train", "--config", "is not valid")


CONFIG_FILE_ERRORS = [
    (
        "run.yaml",
        "learning_rate: 1.0e-4\nfan_in: 8\nlearning_rate: 1.0e-3\n",
        ["key 'learning_rate' is given twice (line 3)"],
    ),
    ("run.json", '{"learning_rate": 1e-4, "learning_rate": 1e-3}', ["key 'learning_rate' is given twice"]),
    (
        "run.yaml",
        "learning-rate: 1.0e-4\nlearning_rate: 1.0e-3\n",
        ["'learning_rate' is given twice (as 'learning_rate' too)"],
    ),
    ("run.yaml", "per_device_train_batch_size: null\n", ["'per_device_train_batch_size' is null"]),
    ("run.yaml", "fan_in: 6.7\n", ["'fan_in' must be an integer, got 6.7"]),
    ("run.json", '{"max_steps": 2.5}', ["'max_steps' must be an integer, got 2.5"]),
    ("run.json", '{"seed": true}', ["'seed' must be an integer, got True"]),
    ("run.yaml", "learning_rate: fast\n", ["'learning_rate' must be a number, got 'fast'"]),
    ("run.yaml", "fan_in: '6.7'\n", ["'fan_in' must be an integer, got '6.7'"]),
    ("run.yaml", "bf16: 1.5\n", ["'bf16' must be true or false, got 1.5"]),
    ("run.yaml", "grouping: kmeans\n", ["'grouping' must be one of semantic, frequency, random, got 'kmeans'"]),
    ("run.yaml", "1: 2\n", ["key 1 is not a flag name"]),
]


@pytest.mark.parametrize("name, text, fragments", CONFIG_FILE_ERRORS, ids=[text for _, text, _ in CONFIG_FILE_ERRORS])
def test_config_file_values_are_checked_naming_the_key(capsys, monkeypatch, tmp_path, name, text, fragments):
    import haste_hf.cli.commands

    monkeypatch.setattr(haste_hf.cli.commands, "command_train", lambda args: pytest.fail("the command ran"))
    (tmp_path / name).write_text(text)
    status, lines = run_cli(capsys, ["train", "--config", tmp_path / name])
    assert_one_line_error(status, lines, 2, "train", "--config", *fragments)


def test_config_file_values_of_the_right_type_are_taken(tmp_path):
    from haste_hf.cli.parser import parse_args

    (tmp_path / "run.yaml").write_text(
        "group_size: null\nfan_in: 8\nlearning_rate: 1e-4\nwarmup_steps: 3\neval_steps: 0.5\n"
        "bf16: false\ngrouping: random\nreport_to: [none]\n"
    )
    args = parse_args(["train", "--config", str(tmp_path / "run.yaml"), "--output-dir", str(tmp_path / "out")])
    assert (args.recipe.group_size, args.recipe.fan_in, args.recipe.grouping) == (None, 8, "random")
    assert (args.training.learning_rate, args.training.warmup_steps, args.training.bf16) == (1e-4, 3, False)
