"""Command-line usage errors: one line, naming the flag, file or count at fault, before anything heavy loads,
and no half-written output."""

import json
import os
import shutil

import faults
import pytest
from faults import CLI_LABELS, corrupt, make_model
from launch import assert_one_line_error, run_cli
from safetensors.torch import load_file, save_file
from tiny_encoders import tiny_tokenizer

from haste_hf.modeling.saving import (
    INCOMPLETE_SAVE_FILE,
)


cli_files = faults.cli_files  # the fixture: datasets of 30, 40 and 20 labels, a saved model, texts


# ---------------------------------------------------------------------------------------------- command line

# Each: the flags after the command, and fragments the one line must contain. Checked while parsing.
TRAIN_USAGE_ERRORS = [
    (["--batch-size", "0"], ["`per_device_train_batch_size` must be >= 1, got 0"]),
    (["--per-device-train-batch-size", "-3"], ["`per_device_train_batch_size` must be >= 1, got -3"]),
    (["--batch-size", "eight"], ["--per-device-train-batch-size", "invalid int value: 'eight'"]),
    (["--gradient-accumulation-steps", "0"], ["`gradient_accumulation_steps` must be >= 1"]),
    (["--eval-batch-size", "0"], ["`per_device_eval_batch_size` must be >= 1"]),
    (["--validation-fraction", "1"], ["`validation_fraction` must lie in [0, 1)", "got 1.0"]),
    (["--validation-fraction", "-0.1"], ["`validation_fraction` must lie in [0, 1)"]),
    (["--validation-fraction", "nan"], ["`validation_fraction` must lie in [0, 1)", "got nan"]),
    (["--epochs", "0"], ["`num_train_epochs` must be > 0"]),
    (["--max-steps", "0"], ["`max_steps` must be >= 1, or -1"]),
    (["--lr=-1e-5"], ["`learning_rate` must be >= 0"]),
    (["--output-lr=-0.1"], ["`output_learning_rate` must be >= 0"]),
    (["--output-momentum", "1"], ["`output_momentum` must lie in [0, 1)"]),
    (["--eval-strategy", "steps", "--save-strategy", "steps", "--eval-steps", "0"], ["`eval_steps` must be > 0"]),
    (["--logging-steps", "0"], ["non-zero --logging_steps"]),
    (["--group-size", "0"], ["`group_size` must be >= 1"]),
    (["--fan-in", "0"], ["`fan_in` must be >= 1"]),
    (["--head-fraction", "1.5"], ["`head_label_fraction` must lie in [0, 1]"]),
    (["--max-length", "0"], ["`max_length` must be >= 1"]),
    (["--rewiring-fraction", "0"], ["rewiring_fraction"]),
    (["--rewiring-end", "2"], ["rewiring_end"]),
    (["--rewiring-interval=-5"], ["`rewiring_interval` must be >= 0"]),
    (["--beta", "0.5"], ["`beta`", "must be >= 1"]),
    (["--num-workers=-1"], ["`dataloader_num_workers` must be >= 0"]),
    (["--propensity-a", "0"], ["`propensity_a` must be > 0"]),
    (["--on-non-finite", "ignore"], ["`on_non_finite` must be one of"]),
    (["--format", "xml"], ["`format` must be one of"]),
    (["--data", "no/such/folder"], ["`data`: no folder 'no/such/folder'"]),
    (["--encoder", "./no-such-encoder"], ["`encoder`: no folder './no-such-encoder'"]),
    (["--encoder", "a/b/c"], ["`encoder`: no folder 'a/b/c'"]),
    (["--grouping-file", "missing.safetensors"], ["`layout_file`: no file 'missing.safetensors'"]),
    (["--config", "missing.yaml"], ["--config", "missing.yaml"]),
    (["--no-such-flag"], ["unrecognized arguments: --no-such-flag"]),
    (
        ["--validation-fraction", "0.1", "--save-strategy", "steps"],
        ["--save-strategy steps with --eval-strategy epoch", "--eval-steps N", "--validation-fraction 0"],
    ),
    (
        ["--validation-fraction", "0.1", "--save-strategy", "no"],
        ["--save-strategy no with --eval-strategy epoch", "--load-best-model-at-end false"],
    ),
    (
        ["--validation-fraction", "0.1", "--eval-strategy", "no"],
        ["--save-strategy epoch with --eval-strategy no", "--load-best-model-at-end false"],
    ),
]


@pytest.mark.parametrize(
    "flags, fragments", TRAIN_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in TRAIN_USAGE_ERRORS]
)
def test_train_usage_errors_are_one_line_before_anything_loads(capsys, monkeypatch, flags, fragments):
    import haste_hf.cli.commands

    monkeypatch.setattr(haste_hf.cli.commands, "command_train", lambda args: pytest.fail("the command ran"))
    status, lines = run_cli(capsys, ["train", *flags])
    assert_one_line_error(status, lines, 2, "train", *fragments)


def uninstalled_integration() -> str:
    """A `--report-to` name transformers knows whose package this environment lacks."""
    from transformers.integrations import integration_utils

    from haste_hf.cli.parser import _INTEGRATION_CHECK_NAMES

    for name in integration_utils.INTEGRATION_TO_CALLBACK:
        if not getattr(integration_utils, f"is_{_INTEGRATION_CHECK_NAMES.get(name, name)}_available")():
            return name
    pytest.fail("every reporting integration is installed here: none to refuse")


def test_report_to_an_uninstalled_or_unknown_integration_is_one_line_before_the_run(
    capsys, monkeypatch, tmp_path, dataset_dir, encoder_dir
):
    """`check_report_to` runs in `haste-hf train` before the data, encoder and layout load (the Trainer would fail
    on it only after them); an installed integration passes; names checked under another name (azure_ml:
    azureml) are looked up by that name."""
    from transformers.integrations import integration_utils

    import haste_hf.recipe
    from haste_hf.cli.errors import UsageError
    from haste_hf.cli.parser import check_report_to

    monkeypatch.setattr(haste_hf.recipe, "train", lambda *args, **kwargs: pytest.fail("the run started"))
    folders = ["--data", str(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(tmp_path / "out")]
    name = uninstalled_integration()
    status, lines = run_cli(capsys, ["train", *folders, "--report-to", name])
    assert_one_line_error(status, lines, 2, "train", f"argument --report-to: {name} is not installed")
    status, lines = run_cli(capsys, ["train", *folders, "--report-to", "no-such-tracker"])
    assert_one_line_error(status, lines, 2, "train", "unknown integration 'no-such-tracker'", "wandb")
    assert not (tmp_path / "out").exists()
    monkeypatch.setattr(integration_utils, "is_wandb_available", lambda: True)
    check_report_to(["wandb"])  # installed: no refusal
    monkeypatch.setattr(integration_utils, "is_azureml_available", lambda: True)
    check_report_to(["azure_ml"])
    monkeypatch.setattr(integration_utils, "is_azureml_available", lambda: False)
    with pytest.raises(UsageError, match="azure_ml is not installed"):
        check_report_to(["azure_ml"])


def test_a_file_given_as_data_folder(capsys, cli_files):
    status, lines = run_cli(capsys, ["train", "--data", cli_files["texts"]])
    assert_one_line_error(status, lines, 2, "train", "`data`", "(it is a file)")


def test_a_config_file_with_an_unknown_key_is_a_one_line_error(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rte: 1.0e-4\n")
    status, lines = run_cli(capsys, ["train", "--config", config])
    assert_one_line_error(status, lines, 2, "train", "unknown key 'learning_rte'", "did you mean 'learning_rate'")


@pytest.mark.parametrize("command", ["train", "group", "evaluate"])
def test_bag_of_words_data_is_refused_up_front(capsys, cli_files, monkeypatch, tmp_path, command):
    import haste_hf.recipe

    monkeypatch.setattr(haste_hf.recipe, "load_encoder", lambda name: pytest.fail("the encoder was loaded"))
    flags = {
        "train": ["--encoder", cli_files["model"], "--output-dir", tmp_path / "out"],
        "group": ["--output", tmp_path / "layout.safetensors"],
        "evaluate": ["--model", cli_files["model"]],
    }[command]
    status, lines = run_cli(capsys, [command, "--data", cli_files["bow"], *flags])
    assert_one_line_error(status, lines, 1, command, "is a bag-of-words dataset", "raw-text release")
    assert not (tmp_path / "out").exists() and not (tmp_path / "layout.safetensors").exists()


@pytest.mark.parametrize("data, count", [("data40", "40"), ("data20", "20")])
def test_evaluate_on_data_of_another_label_count_names_both_counts(capsys, cli_files, tmp_path, data, count):
    output = tmp_path / "metrics.json"
    status, lines = run_cli(
        capsys, ["evaluate", "--model", cli_files["model"], "--data", cli_files[data], "--output", output]
    )
    assert_one_line_error(status, lines, 2, "evaluate", "has 30 labels and the dataset " + count)
    assert not output.exists()


def test_a_model_of_other_labels_is_not_run_on_the_demo_set_read_by_default(capsys, cli_files, tmp_path):
    """Without --data (nor --input) evaluate and predict read the embedded demo set: for a model trained on other
    data, predict refused to label the demo's texts (it wrote them silently) and evaluate says the demo set was read."""
    output = tmp_path / "top5.jsonl"
    status, lines = run_cli(capsys, ["predict", "--model", cli_files["model"], "--output", output])
    assert_one_line_error(
        status, lines, 2, "predict", "labels the embedded demo set's texts", "(30 labels, the demo set 452)", "--input"
    )
    assert not output.exists()
    status, lines = run_cli(capsys, ["evaluate", "--model", cli_files["model"]])
    assert_one_line_error(status, lines, 2, "evaluate", "has 30 labels and the dataset 452", "the embedded demo set")


def test_evaluate_on_data_of_other_label_names_is_refused_unless_asked(capsys, cli_files, tmp_path):
    data = tmp_path / "renamed"
    shutil.copytree(cli_files["data"], data)
    names = [f"label {i}" if i % 10 else f"renamed {i}" for i in range(CLI_LABELS)]  # 3 of 30 differ, the first is 0
    (data / "lbl.json.gz").unlink()
    (data / "lbl.json").write_text(
        "".join(json.dumps({"uid": str(i), "title": name}) + "\n" for i, name in enumerate(names))
    )
    output = tmp_path / "metrics.json"
    status, lines = run_cli(capsys, ["evaluate", "--model", cli_files["model"], "--data", data, "--output", output])
    assert_one_line_error(
        status,
        lines,
        2,
        "evaluate",
        "3 of 30 names differ",
        "label 0 is 'label 0' in the model, 'renamed 0'",
        "--ignore-label-names",
    )
    assert not output.exists()
    status, _ = run_cli(
        capsys, ["evaluate", "--model", cli_files["model"], "--data", data, "--output", output, "--ignore-label-names"]
    )
    assert status == 0 and "P@1" in json.loads(output.read_text())


def test_evaluate_of_a_model_with_fewer_labels_than_the_summary_k(capsys, cli_files, tmp_path):
    folder = tmp_path / "three"
    make_model(label_count=3, head_label_count=1, group_size=2, fan_in=4).save_pretrained(folder)
    tiny_tokenizer(folder)
    data = tmp_path / "data3"
    data.mkdir()
    for name in ("trn.json", "tst.json"):
        (data / name).write_text(
            "".join(json.dumps({"uid": str(i), "title": f"w{i}", "target_ind": [i % 3]}) + "\n" for i in range(6))
        )
    (data / "lbl.json").write_text("".join(json.dumps({"uid": str(i), "title": f"l{i}"}) + "\n" for i in range(3)))
    output = tmp_path / "metrics.json"
    status, _ = run_cli(capsys, ["evaluate", "--model", folder, "--data", data, "--output", output])
    metrics = json.loads(output.read_text())
    assert status == 0 and {"P@1", "P@3"} <= set(metrics) and "P@5" not in metrics


EVALUATE_USAGE_ERRORS = [
    (["--model", "no-such-model"], ["--model", "no folder 'no-such-model'"]),
    (["--model", "./missing/model"], ["--model", "no folder './missing/model'"]),
    (["--model", "{model}", "--output", "missing-folder/metrics.json"], ["--output", "does not exist"]),
    (["--model", "{model}", "--output", "{model}"], ["--output", "is a folder"]),
    (["--model", "{model}", "--data", "{data}", "--split", "dev"], ["--split", "'dev' is not a split", "test, train"]),
    (["--data", "{data}"], ["the following arguments are required: --model"]),
]


@pytest.mark.parametrize(
    "flags, fragments", EVALUATE_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in EVALUATE_USAGE_ERRORS]
)
def test_evaluate_usage_errors(capsys, cli_files, flags, fragments):
    flags = [flag.format(**cli_files) for flag in flags]
    status, lines = run_cli(capsys, ["evaluate", *flags])
    assert_one_line_error(status, lines, 2, "evaluate", *fragments)


PREDICT_USAGE_ERRORS = [
    (["--input", "missing.txt"], ["--input", "no file 'missing.txt'"]),
    (["--input", "{empty}"], ["--input", "holds no texts"]),
    (["--input", "{texts}", "--output", "missing-folder/top.jsonl"], ["--output", "does not exist; create it first"]),
    (["--input", "{texts}", "-k", "0"], ["-k", "must be >= 1"]),
    (["--input", "{texts}", "-k", "31"], ["-k", "31 exceeds the 30 labels"]),
    (["--model", "missing", "--input", "{texts}"], ["--model", "no folder 'missing'"]),
    (["--data", "{data}", "--split", "dev"], ["--split", "'dev' is not a split"]),
]


@pytest.mark.parametrize(
    "flags, fragments", PREDICT_USAGE_ERRORS, ids=[" ".join(flags) for flags, _ in PREDICT_USAGE_ERRORS]
)
def test_predict_usage_errors_leave_no_output(capsys, cli_files, tmp_path, flags, fragments):
    flags = [flag.format(**cli_files) for flag in flags]
    output = tmp_path / "top.jsonl"
    arguments = ["--model", cli_files["model"], "--output", output, *flags]
    status, lines = run_cli(capsys, ["predict", *arguments])
    assert_one_line_error(status, lines, 2, "predict", *fragments)
    assert not output.exists()


def test_predict_input_that_is_not_utf8_names_the_file_and_line(capsys, cli_files, tmp_path):
    texts = tmp_path / "latin1.txt"
    texts.write_bytes("w3 w40\nw7 caf\u00e9\n".encode("latin-1"))
    output = tmp_path / "top.jsonl"
    status, lines = run_cli(capsys, ["predict", "--model", cli_files["model"], "--input", texts, "--output", output])
    assert_one_line_error(
        status, lines, 2, "predict", "--input", f"{texts} line 2 is not UTF-8", "byte 0xe9 at column 7"
    )
    assert not output.exists()


def test_predict_with_non_finite_scores_fails_and_keeps_the_previous_output(capsys, cli_files, tmp_path):
    folder = tmp_path / "nan-model"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    tiny_tokenizer(folder)
    corrupt(folder, "output_layer.head.bias", lambda bias: bias.fill_(float("nan")))
    output = tmp_path / "top.jsonl"
    output.write_text("previous\n")
    status, lines = run_cli(capsys, ["predict", "--model", folder, "--input", cli_files["texts"], "--output", output])
    # The output layer refuses to rank NaN scores (in one process on the CPU; elsewhere predict checks them gathered).
    assert_one_line_error(status, lines, 1, "predict", "scores hold NaN", "the labels cannot be ranked")
    assert output.read_text() == "previous\n" and set(os.listdir(tmp_path)) == {"nan-model", "top.jsonl"}


def test_predict_writes_one_record_per_line_blank_lines_included(capsys, cli_files, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("w3 w40\n\nw7\n")
    output = tmp_path / "top.jsonl"
    status, _ = run_cli(
        capsys, ["predict", "--model", cli_files["model"], "--input", texts, "--output", output, "-k", "30"]
    )
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert status == 0 and len(records) == 3 and all(sorted(r["label_ids"]) == list(range(30)) for r in records)


def test_a_corrupt_model_is_a_one_line_library_error(capsys, cli_files, tmp_path):
    folder = tmp_path / "corrupt"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    tiny_tokenizer(folder)
    corrupt(folder, "output_layer.tail.supports", lambda supports: supports.__setitem__((0, 0), 1000))
    status, lines = run_cli(
        capsys, ["predict", "--model", folder, "--input", cli_files["texts"], "--output", tmp_path / "o.jsonl"]
    )
    assert_one_line_error(status, lines, 1, "predict", "tail supports", "outside [0, 32)")


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_weights_of_another_shape_are_a_one_line_library_error(capsys, cli_files, tmp_path, command):
    """A weights file whose head has another row count: transformers' RuntimeError (a size mismatch) is the model
    file's fault, said in one line with status 1, not a traceback."""
    folder = tmp_path / "mismatched"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    tiny_tokenizer(folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["output_layer.head.weight"] = tensors["output_layer.head.weight"][:1].contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    flags = {
        "evaluate": ["--data", cli_files["data"]],
        "predict": ["--input", cli_files["texts"], "--output", tmp_path / "o.jsonl"],
    }[command]
    status, lines = run_cli(capsys, [command, "--model", folder, *flags])
    assert_one_line_error(status, lines, 1, command, "ignore_mismatched_sizes")
    assert not (tmp_path / "o.jsonl").exists()


def test_an_interrupted_save_is_a_one_line_library_error(capsys, cli_files, tmp_path):
    folder = tmp_path / "interrupted"
    make_model(label_count=CLI_LABELS, head_label_count=2).save_pretrained(folder)
    (folder / INCOMPLETE_SAVE_FILE).write_text("{}")
    for command in (["evaluate", "--data", cli_files["data"]], ["push", "--repo-id", "user/model"]):
        status, lines = run_cli(capsys, [command[0], "--model", folder, *command[1:]])
        assert_one_line_error(status, lines, 1, command[0], "interrupted save")


GROUP_AND_PUSH_USAGE_ERRORS = [
    (["group", "--output", "missing-folder/grouping.safetensors"], ["--output", "does not exist"]),
    (["group", "--output", "g.safetensors", "--group-size", "0"], ["`group_size` must be >= 1"]),
    (["group", "--output", "g.safetensors", "--data", "missing"], ["`data`: no folder 'missing'"]),
    (["push", "--model", "missing", "--repo-id", "user/model"], ["--model", "no folder 'missing'"]),
    (["push", "--model", "{texts}", "--repo-id", "user/model"], ["--model", "(it is a file)"]),
    (["push", "--model", "{model}", "--repo-id", "user/a/b"], ["--repo-id", "not a Hub repository id"]),
    (["push", "--model", "{model}"], ["required: --repo-id"]),
]


@pytest.mark.parametrize(
    "argv, fragments", GROUP_AND_PUSH_USAGE_ERRORS, ids=[" ".join(argv) for argv, _ in GROUP_AND_PUSH_USAGE_ERRORS]
)
def test_group_and_push_usage_errors(capsys, cli_files, argv, fragments):
    argv = [arg.format(**cli_files) for arg in argv]
    status, lines = run_cli(capsys, argv)
    assert_one_line_error(status, lines, 2, argv[0], *fragments)


def test_pushing_a_folder_that_holds_no_model_is_a_one_line_library_error(capsys, tmp_path):
    status, lines = run_cli(capsys, ["push", "--model", tmp_path, "--repo-id", "user/model"])
    assert_one_line_error(status, lines, 1, "push", "has no config.json")


def test_no_command_is_a_one_line_error(capsys):
    status, lines = run_cli(capsys, [])
    assert status == 2 and len(lines) == 1 and "required: command" in lines[0]
