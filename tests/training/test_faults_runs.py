"""Runs that must not be lost, and runs refused up front in one line: two runs into one output folder, an
output folder that cannot be written, empty shares of a sharded output layer, a token length beyond the
encoder's, resuming from a checkpoint of another model, and the library errors the command line reports.

The command-line helpers come from launch.py, the data from faults.py."""

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap

import faults
import processes
import pytest
import torch
from faults import CLI_LABELS, make_model
from launch import LOSS_TOLERANCE, TESTS, assert_one_line_error, assert_states_close, run_cli, torchrun, train_flags
from transformers.testing_utils import CaptureLogger

from haste_hf import HasteForExtremeClassification
from haste_hf.modeling.saving import STAGING_PREFIX
from haste_hf.training.run_lock import LOCK_FILE, OutputDirInUseError, output_dir_lock


cli_files = faults.cli_files  # the fixture: datasets of 30, 40 and 20 labels, a saved model, texts


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
        from haste_hf.training.run_lock import output_dir_lock
        with output_dir_lock({str(folder)!r}):
            print("held", flush=True)
            sys.stdin.read()
    """)
    process = processes.start(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert process.stdout.readline().strip() == "held"
        yield folder, process.pid
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        processes.kill_group(process.pid)
        process.wait()


def test_a_second_train_into_a_folder_being_trained_into_is_refused_before_anything_loads(
    capsys, cli_files, encoder_dir, lock_holder, monkeypatch
):
    import haste_hf.recipe

    folder, pid = lock_holder
    monkeypatch.setattr(haste_hf.recipe, "load_dataset", lambda *args: pytest.fail("the data was loaded"))
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert_one_line_error(
        status, lines, 1, "train", str(folder), f"process {pid} on host {socket.gethostname()}", "--output-dir"
    )
    assert os.listdir(folder) == [LOCK_FILE]  # the holder's lock, untouched


def test_a_lock_file_of_a_live_process_is_refused_and_one_of_an_ended_process_taken_over(tmp_path):
    import haste_hf.training.run_lock

    folder = tmp_path / "out"
    plant_lock(folder, os.getppid())  # alive: the process that started the tests
    with pytest.raises(OutputDirInUseError, match=f"process {os.getppid()} on host"), output_dir_lock(folder):
        pytest.fail("the lock was taken")
    pid = dead_pid()
    plant_lock(folder, pid)
    with CaptureLogger(haste_hf.training.run_lock.logger) as captured, output_dir_lock(folder):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"taking over the lock of process {pid} on host" in captured.out
    assert os.listdir(folder) == []  # released


@pytest.mark.parametrize("error", [ValueError("bad data"), KeyboardInterrupt()])
def test_the_lock_is_released_when_the_run_fails_or_is_interrupted(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch, error
):
    import haste_hf.recipe

    folder = tmp_path / "out"
    held = []

    def fail(*args):
        held.append((folder / LOCK_FILE).is_file())
        raise error

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", fail)
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert status == (1 if isinstance(error, ValueError) else 130) and held == [True]
    assert not folder.exists()  # neither the lock nor the folder it was made for is left
    with output_dir_lock(folder):  # and a new run takes the folder
        pass


def test_a_run_holds_its_folder_until_its_model_is_saved_and_then_releases_it(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch
):
    import haste_hf.recipe

    folder = tmp_path / "out"
    held, save = [], haste_hf.recipe.save_trained

    def watched(*args, **kwargs):
        held.append((folder / LOCK_FILE).is_file())
        return save(*args, **kwargs)

    monkeypatch.setattr(haste_hf.recipe, "save_trained", watched)
    status, _ = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
    assert status == 0 and held == [True] and not (folder / LOCK_FILE).exists()
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
    cases = [
        (tmp_path / "file", "is a file"),
        (tmp_path / "file" / "out", f"cannot be created: {tmp_path / 'file'} is a file"),
    ]
    if os.geteuid() == 0:
        cases.append(("/sys/haste-out", "is not writable"))
    else:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        os.chmod(read_only, 0o555)
        cases.append((read_only / "out", "is not writable"))
    return cases


def test_an_unwritable_output_folder_is_refused_before_anything_loads(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch
):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_dataset", lambda *args: pytest.fail("the data was loaded"))
    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda *args: pytest.fail("the encoder was loaded"))
    for folder, fragment in unwritable_folders(tmp_path):
        status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, folder))
        assert_one_line_error(status, lines, 2, "train", "--output-dir", str(folder), fragment)
        with pytest.raises(ValueError, match=fragment):  # the library call too
            haste_hf.recipe.train(cli_files["data"], str(encoder_dir), output_dir=str(folder))


# ------------------------------------------------------------------------------------- the encoder's token limit


def test_the_token_limit_of_an_encoder_counts_reserved_positions():
    from tiny_encoders import tiny_encoder_config
    from transformers import AutoModel

    from haste_hf.recipe import encoder_token_limit

    assert encoder_token_limit(AutoModel.from_config(tiny_encoder_config("bert"))) == 64
    assert (
        encoder_token_limit(AutoModel.from_config(tiny_encoder_config("roberta"))) == 70
    )  # 72 less padding index 1 + 1


def test_a_max_length_beyond_the_encoder_is_refused_before_training(
    capsys, cli_files, encoder_dir, tmp_path, monkeypatch
):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "build_layout", lambda *args, **kwargs: pytest.fail("the layout was computed"))
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder_dir, tmp_path / "out", "--max-length", "65"))
    assert_one_line_error(
        status, lines, 1, "train", "--max-length", "is 65", "at most 64 tokens", "pass --max-length 64 or less"
    )
    assert not (tmp_path / "out").exists()
    status, lines = run_cli(
        capsys,
        [
            "group",
            "--data",
            cli_files["data"],
            "--encoder",
            encoder_dir,
            "--max-length",
            "65",
            "--output",
            tmp_path / "layout.safetensors",
        ],
    )
    assert_one_line_error(status, lines, 1, "group", "--max-length", "at most 64 tokens")


def test_evaluate_and_predict_refuse_a_max_length_beyond_the_encoder(capsys, cli_files, tmp_path):
    output = tmp_path / "top.jsonl"
    status, lines = run_cli(
        capsys,
        [
            "predict",
            "--model",
            cli_files["model"],
            "--input",
            cli_files["texts"],
            "--output",
            output,
            "--max-length",
            "100",
        ],
    )
    assert_one_line_error(status, lines, 2, "predict", "--max-length", "is 100", "at most 64 tokens")
    assert not output.exists()
    # A folder without the settings of training reads at most the encoder's limit (not 128): long texts work.
    texts = tmp_path / "long.txt"
    texts.write_text(" ".join(f"w{i % 90}" for i in range(300)) + "\n")
    status, _ = run_cli(capsys, ["predict", "--model", cli_files["model"], "--input", texts, "--output", output])
    assert status == 0 and len(output.read_text().splitlines()) == 1


# ------------------------------------------------------------------------------------- resuming another model's checkpoint

RESUME_FLAGS = ("--validation-fraction", "0", "--epochs", "2", "--save-total-limit", "2")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cli_files, encoder_dir):
    """A finished two-epoch run (group size 4, fan-in 8) with its checkpoints 3 and 6."""
    from haste_hf.cli import main

    output = tmp_path_factory.mktemp("finished") / "out"
    assert main([str(arg) for arg in train_flags(cli_files["data"], encoder_dir, output, *RESUME_FLAGS)]) == 0
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    return output


@pytest.fixture
def run_copy(finished_run, tmp_path):
    import shutil

    return shutil.copytree(finished_run, tmp_path / "out")


def resume(capsys, data, encoder_dir, output, *extra):
    return run_cli(capsys, train_flags(data, encoder_dir, output, *RESUME_FLAGS, "--resume-from-checkpoint", *extra))


@pytest.mark.parametrize(
    "flags, difference",
    [
        (["--group-size", "2"], "group_size is 4 (this run: 2)"),
        (["--fan-in", "4"], "fan_in is 8 (this run: 4)"),
        (["--pooling", "cls"], "pooling is mean (this run: cls)"),
    ],
)
def test_resuming_a_checkpoint_of_another_model_names_the_setting(
    capsys, cli_files, encoder_dir, run_copy, flags, difference
):
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy, *flags)
    assert_one_line_error(status, lines, 1, "train", "checkpoint-6 is a checkpoint of another model", difference)


def test_resuming_a_checkpoint_trained_on_normalised_features_names_them(capsys, cli_files, encoder_dir, run_copy):
    """A checkpoint of a model that normalised its features (`from_encoder_pretrained` kept a SentenceTransformer's
    Normalize before issue 40) loads into a model that does not: the run would go on with other features in silence."""
    config_file = run_copy / "checkpoint-6" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "normalize": True}))
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy)
    assert_one_line_error(
        status,
        lines,
        1,
        "train",
        "checkpoint-6 is a checkpoint of another model",
        "normalize is True (this run: False)",
    )


# The tail's defaults before issue 39: one SGD rate for head and tail (one parameter group), no tail bias.
OLD_TAIL_FLAGS = ("--output-tail-lr-scale", "1", "--no-tail-bias")


def test_a_checkpoint_of_the_old_tail_defaults_resumes_only_as_it_was_trained(capsys, cli_files, encoder_dir, tmp_path):
    """A run trained before the tail's defaults changed resumes with its own settings; under the new defaults each
    is refused in one line naming the flag that resumes it, never a silent mismatch of weights or parameter groups."""
    from haste_hf.cli import main

    output = tmp_path / "old"
    argv = train_flags(cli_files["data"], encoder_dir, output, *RESUME_FLAGS, *OLD_TAIL_FLAGS)
    assert main([str(arg) for arg in argv]) == 0
    status, lines = resume(capsys, cli_files["data"], encoder_dir, output)
    assert_one_line_error(status, lines, 1, "train", "of another model", "tail_bias is False (this run: True;")
    assert "--no-tail-bias resumes it" in lines[0]
    status, lines = resume(capsys, cli_files["data"], encoder_dir, output, "--no-tail-bias")
    assert_one_line_error(
        status, lines, 1, "train", "1 parameter group(s) and this run's 2", "--output-tail-lr-scale 1 (`output_tail_lr"
    )
    status, lines = resume(capsys, cli_files["data"], encoder_dir, output, *OLD_TAIL_FLAGS)
    assert status == 0, lines
    assert HasteForExtremeClassification.from_pretrained(output).output_layer.tail.bias is None


def test_resuming_a_checkpoint_of_another_label_count_names_both_counts(capsys, cli_files, encoder_dir, run_copy):
    status, lines = resume(capsys, cli_files["data40"], encoder_dir, run_copy)
    assert_one_line_error(status, lines, 1, "train", "of another model", "label_count is 30 (this run: 40)")


def test_resuming_a_checkpoint_of_another_dataset_of_the_same_shape_is_refused(
    capsys, cli_files, encoder_dir, run_copy, tmp_path
):
    import gzip
    import shutil

    from tiny_encoders import planted_texts

    other = shutil.copytree(cli_files["data"], tmp_path / "other")
    with gzip.open(other / "trn.json.gz", "wt") as f:
        for i, row in enumerate(planted_texts(CLI_LABELS, 40, seed=7)):
            f.write(
                json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}) + "\n"
            )
    status, lines = resume(capsys, other, encoder_dir, run_copy, "--group-size", "4")
    assert_one_line_error(status, lines, 1, "train", "checkpoint-6 was trained on another training split", "--seed")


def test_a_checkpoint_with_truncated_weights_is_passed_over_with_a_warning(
    capsys, caplog, cli_files, encoder_dir, run_copy
):
    weights = run_copy / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy)
    assert status == 0, lines
    assert re.search(
        r"Passing over \S+checkpoint-6: it is not a complete checkpoint \(a damaged model.safetensors", caplog.text
    )
    state = json.loads((run_copy / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6  # trained again from checkpoint-3
    torch.testing.assert_close(
        HasteForExtremeClassification.from_pretrained(run_copy).output_layer.tail.weight,
        HasteForExtremeClassification.from_pretrained(run_copy / "checkpoint-6").output_layer.tail.weight,
    )


def test_a_named_checkpoint_with_truncated_weights_is_refused_naming_an_earlier_one(
    capsys, cli_files, encoder_dir, run_copy
):
    weights = run_copy / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy, run_copy / "checkpoint-6")
    assert_one_line_error(
        status,
        lines,
        1,
        "train",
        "checkpoint-6 is not a complete checkpoint",
        "damaged model.safetensors",
        "resume from " + str(run_copy / "checkpoint-3"),
    )


def test_a_checkpoint_without_optimizer_state_resumes_with_a_loud_warning(
    capsys, caplog, cli_files, encoder_dir, run_copy
):
    (run_copy / "checkpoint-6" / "optimizer.pt").unlink()
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy)
    assert status == 0, lines
    assert re.search(
        r"checkpoint-6 holds no optimizer.pt: the run resumes its weights with FRESH optimizer state", caplog.text
    )


def test_a_damaged_optimizer_file_is_a_one_line_error_naming_it(capsys, cli_files, encoder_dir, run_copy):
    optimizer = run_copy / "checkpoint-6" / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:200])
    status, lines = resume(capsys, cli_files["data"], encoder_dir, run_copy)
    assert_one_line_error(status, lines, 1, "train", "checkpoint-6: its optimizer.pt or scheduler.pt does not load")


# ------------------------------------------------------------------------------------- library errors in one line


def test_a_model_folder_with_truncated_weights_is_a_one_line_error(capsys, cli_files, tmp_path, monkeypatch):
    import shutil

    from safetensors import SafetensorError

    folder = shutil.copytree(cli_files["model"], tmp_path / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    arguments = ["evaluate", "--model", folder, "--data", cli_files["data"]]
    status, lines = run_cli(capsys, arguments)
    assert_one_line_error(status, lines, 1, "evaluate", f"{folder}: its weights do not load", "incomplete metadata")
    monkeypatch.setenv("HASTE_HF_DEBUG", "1")  # the traceback, for a bug report
    with pytest.raises(ValueError, match="its weights do not load") as raised:
        run_cli(capsys, arguments)
    assert isinstance(raised.value.__cause__, SafetensorError)


def test_a_model_folder_whose_weights_have_other_shapes_is_a_one_line_error(capsys, cli_files, tmp_path):
    import shutil

    folder = shutil.copytree(cli_files["model"], tmp_path / "model")
    make_model(label_count=CLI_LABELS, head_label_count=2, fan_in=4).save_pretrained(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / "model.safetensors", folder / "model.safetensors")
    status, lines = run_cli(
        capsys, ["predict", "--model", folder, "--input", cli_files["texts"], "--output", tmp_path / "top.jsonl"]
    )
    assert_one_line_error(status, lines, 1, "predict", f"{folder}: its weights do not load")


def test_a_folder_without_config_json_is_named(capsys, cli_files, encoder_dir, tmp_path):
    import shutil

    model = shutil.copytree(cli_files["model"], tmp_path / "model")
    (model / "config.json").unlink()
    status, lines = run_cli(capsys, ["evaluate", "--model", model, "--data", cli_files["data"]])
    assert_one_line_error(status, lines, 2, "evaluate", "--model", f"{model} holds no config.json")
    encoder = shutil.copytree(encoder_dir, tmp_path / "encoder")
    (encoder / "config.json").unlink()
    status, lines = run_cli(capsys, train_flags(cli_files["data"], encoder, tmp_path / "out"))
    assert_one_line_error(status, lines, 2, "train", "`encoder`", f"{encoder} holds no config.json")


def test_report_to_an_integration_not_installed_or_unknown_is_refused_before_anything_loads(capsys, monkeypatch):
    from transformers.integrations import integration_utils

    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_dataset", lambda *args: pytest.fail("the data was loaded"))
    monkeypatch.setattr(integration_utils, "is_wandb_available", lambda: False)
    status, lines = run_cli(capsys, ["train", "--report-to", "wandb"])
    assert_one_line_error(status, lines, 2, "train", "--report-to", "wandb is not installed")
    status, lines = run_cli(capsys, ["train", "--report-to", "wandbb"])
    assert_one_line_error(status, lines, 2, "train", "--report-to", "unknown integration 'wandbb'", "wandb")


# ------------------------------------------------------------------------------------- empty shares of a sharded output layer


@pytest.mark.slow
@pytest.mark.parametrize(("processes", "tail_lr_scale"), [(2, 2.0), (3, 2.0), (3, 1.0)])
def test_ranks_with_an_empty_share_of_the_output_layer_train_resume_and_predict_as_one_process(
    tmp_path, processes, tail_lr_scale
):
    """6 labels (a head of 2 rows, a tail of 1 group) on more ranks than groups, and on 3 more than head rows: the
    sharded run, its resumption and its predictions equal those of one process with the same global batch, with the
    head and the tail in two parameter groups at two rates (`output_tail_lr_scale` 2) or in one."""
    import distributed_empty_shares

    script = TESTS / "distributed_empty_shares.py"
    torchrun([str(script), str(tmp_path), str(tail_lr_scale)], tmp_path, processes=processes)
    sharded = torch.load(tmp_path / "results.pt", weights_only=False)
    single = distributed_empty_shares.run(tmp_path / "single", tail_lr_scale)
    for part in ("run", "resumed"):
        assert sharded[part]["rewirings"] == single[part]["rewirings"] and single[part]["rewirings"]
        torch.testing.assert_close(
            torch.tensor(sharded[part]["losses"]), torch.tensor(single[part]["losses"]), **LOSS_TOLERANCE
        )
        assert_states_close(sharded[part]["state"], single[part]["state"])
    assert sharded["metrics"].keys() == single["metrics"].keys()
    torch.testing.assert_close(sharded["metrics"], single["metrics"], **LOSS_TOLERANCE)
    for prediction, reference in zip(sharded["predictions"], single["predictions"]):
        assert torch.equal(prediction["top_ids"], reference["top_ids"])
        torch.testing.assert_close(prediction["top_scores"], reference["top_scores"], **LOSS_TOLERANCE)


def test_a_damaged_layout_file_is_a_one_line_error_naming_it(capsys, cli_files, encoder_dir, tmp_path):
    layout = tmp_path / "layout.safetensors"
    layout.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # cut short after its header's length
    status, lines = run_cli(
        capsys, train_flags(cli_files["data"], encoder_dir, tmp_path / "out", "--layout-file", layout)
    )
    assert_one_line_error(status, lines, 1, "train", f"{layout} is not a label layout file, or a damaged one")


@pytest.mark.parametrize(
    "error",
    [
        pickle.UnpicklingError("Weights only load failed"),
        RuntimeError("Error(s) in loading state_dict for Linear: size mismatch for weight"),
    ],
)
def test_a_damaged_file_no_caller_named_is_one_line_and_other_runtime_errors_stay_tracebacks(
    capsys, cli_files, monkeypatch, error
):
    import haste_hf.cli.commands

    def fail(args):
        raise error

    monkeypatch.setattr(haste_hf.cli.commands, "command_evaluate", fail)
    status, lines = run_cli(capsys, ["evaluate", "--model", cli_files["model"]])
    assert_one_line_error(status, lines, 1, "evaluate", str(error), "HASTE_HF_DEBUG=1 shows which")
    monkeypatch.setattr(haste_hf.cli.commands, "command_evaluate", lambda args: torch.empty(-1))  # a bug: its traceback
    with pytest.raises(RuntimeError, match="negative dimension"):
        run_cli(capsys, ["evaluate", "--model", cli_files["model"]])
