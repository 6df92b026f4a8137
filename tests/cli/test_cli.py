import json
import math
import re
import subprocess
import sys

import pytest
import torch
from huggingface_hub import ModelCard
from launch import data_flags
from transformers import AutoTokenizer

from haste_hf import HasteForExtremeClassification
from haste_hf.cli import main
from haste_hf.cli.errors import UsageError
from haste_hf.cli.parser import build_parser


@pytest.fixture(scope="module")
def trained(tmp_path_factory, dataset_dir, encoder_dir):
    output = tmp_path_factory.mktemp("model")
    arguments = [
        "train",
        *data_flags(dataset_dir),
        "--encoder",
        str(encoder_dir),
        "--output-dir",
        str(output),
        "--epochs",
        "2",
        "--batch-size",
        "16",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--head-fraction",
        "0.1",
        "--rewiring-interval",
        "5",
        "--lr",
        "1e-3",
        "--propensity-a",
        "0.5",
        "--propensity-b",
        "0.4",
    ]
    assert main(arguments) == 0
    return output


def group(dataset_dir, encoder_dir, layout_file, *flags):
    """`haste-hf group` of the tiny dataset into `layout_file`; its exit status."""
    return main(
        ["group", *data_flags(dataset_dir), "--encoder", str(encoder_dir), "--output", str(layout_file), *flags]
    )


def train_on_layout(dataset_dir, encoder_dir, output_dir, layout_file, *flags):
    """The arguments of a short `haste-hf train` of a tiny model (F = 8) on the label layout of `layout_file`."""
    return [
        "train", *data_flags(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(output_dir),
        "--max-steps", "2", "--fan-in", "8", "--layout-file", str(layout_file), *flags,
    ]  # fmt: skip


def test_train_saves_model_tokenizer_card_and_metrics(trained, dataset_dir, capsys):
    files = {path.name for path in trained.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "label_names.json",
        "tokenizer_config.json",
        "README.md",
        "haste_card.png",
        "test_metrics.json",
    } <= files
    model = HasteForExtremeClassification.from_pretrained(trained)
    assert model.config.head_label_count == 3 and model.config.group_size == 4
    assert model.label_names[5] == "label 5"
    metrics = json.loads((trained / "test_metrics.json").read_text())
    assert {"P@1", "P@5", "PSP@1", "PSP@5"} <= set(metrics)
    metadata = ModelCard.load(trained / "README.md").data.to_dict()
    # A local dataset and a local encoder folder name no Hub dataset or model.
    assert "datasets" not in metadata and "base_model" not in metadata
    assert model.config.id2label[5] == "label 5" and model.config.problem_type == "multi_label_classification"
    card = (trained / "README.md").read_text()
    assert "| Label grouping | semantic |" in card and "A = 0.5, B = 0.4" in card


def test_evaluate_without_repeated_flags_reproduces_training_metrics(trained, dataset_dir, capsys, tmp_path):
    output = tmp_path / "metrics.json"
    assert main(["evaluate", "--model", str(trained), "--data", str(dataset_dir), "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "P " in printed and "PSP" in printed and "A=0.5, B=0.4" in printed
    assert json.loads(output.read_text()) == json.loads((trained / "test_metrics.json").read_text())
    assert AutoTokenizer.from_pretrained(trained).model_max_length == 6
    # An explicit flag still wins over the training setting.
    assert (
        main(
            [
                "evaluate",
                "--model",
                str(trained),
                "--data",
                str(dataset_dir),
                "--max-length",
                "3",
                "--output",
                str(output),
            ]
        )
        == 0
    )
    assert json.loads(output.read_text()) != json.loads((trained / "test_metrics.json").read_text())


def copy_with_settings(trained, tmp_path, settings: dict):
    """A copy of the trained folder whose `evaluation_settings.json` says `settings`, as a downloaded folder might."""
    import shutil

    folder = tmp_path / "downloaded"
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    (folder / "evaluation_settings.json").write_text(json.dumps(settings))
    return folder


def test_a_model_folder_never_chooses_a_file_written_or_the_data_read(trained, dataset_dir, tmp_path, capsys):
    from transformers.testing_utils import CaptureLogger

    from haste_hf import evaluation

    planted_output, planted_data = tmp_path / "planted.json", tmp_path / "elsewhere"
    saved = json.loads((trained / "evaluation_settings.json").read_text())
    folder = copy_with_settings(
        trained,
        tmp_path,
        {
            **saved,
            "output": str(planted_output),
            "data": str(planted_data),
            "split": "trn",
            "model": str(tmp_path),
            "input": str(planted_output),
        },
    )
    with CaptureLogger(evaluation.logger) as captured:
        assert main(["evaluate", "--model", str(folder), "--data", str(dataset_dir)]) == 0
    assert not planted_output.exists()
    assert "test metrics" in capsys.readouterr().out
    assert "ignoring ['data', 'input', 'model', 'output', 'split']" in captured.out
    # Without --data the folder's "data" is not read either: the embedded demo set is, whose labels differ.
    assert main(["evaluate", "--model", str(folder)]) == 2
    assert "30 labels and the dataset 452" in capsys.readouterr().err and not planted_output.exists()
    assert (
        main(
            [
                "predict",
                "--model",
                str(folder),
                "--data",
                str(dataset_dir),
                "-k",
                "2",
                "--output",
                str(tmp_path / "top.jsonl"),
            ]
        )
        == 0
    )
    assert not planted_output.exists() and len((tmp_path / "top.jsonl").read_text().splitlines()) == 40


@pytest.mark.parametrize(
    "key, value",
    [
        ("format", "../x"),
        ("text_fields", ["title"]),
        ("dataset_name", "../../etc"),
        ("propensity_a", "0.5"),
        ("propensity_b", True),
    ],
)
def test_a_model_folders_evaluation_settings_are_type_checked(trained, dataset_dir, tmp_path, capsys, key, value):
    saved = json.loads((trained / "evaluation_settings.json").read_text())
    folder = copy_with_settings(trained, tmp_path, {**saved, key: value})
    assert main(["evaluate", "--model", str(folder), "--data", str(dataset_dir)]) == 1
    error = capsys.readouterr().err
    assert "evaluation_settings.json" in error and repr(key) in error


def test_evaluate_without_data_reads_the_texts_training_read(encoder_dir, tmp_path, capsys):
    """Trained on the demo folder given by path (title by default), evaluated without --data (the embedded demo set,
    whose own default is title + content): the saved settings name the text read, so the metrics are the same."""
    from haste_hf.data import demo_dataset_path

    output = tmp_path / "model"
    arguments = ["train", "--data", str(demo_dataset_path()), "--encoder", str(encoder_dir), "--output-dir", str(output),
                 "--max-steps", "2", "--max-length", "8", "--group-size", "4", "--fan-in", "8"]  # fmt: skip
    assert main(arguments) == 0
    assert json.loads((output / "evaluation_settings.json").read_text())["text_fields"] == "title"
    metrics = tmp_path / "metrics.json"
    assert main(["evaluate", "--model", str(output), "--output", str(metrics)]) == 0
    assert json.loads(metrics.read_text()) == json.loads((output / "test_metrics.json").read_text())


def test_predict_writes_top_k_with_names(trained, tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("w3 w40 w50\nw7 w60\n")
    output = tmp_path / "top.jsonl"
    assert main(["predict", "--model", str(trained), "--input", str(texts), "--output", str(output), "-k", "3"]) == 0
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 2 and all(len(record["label_ids"]) == 3 for record in records)
    assert records[0]["labels"] == [f"label {i}" for i in records[0]["label_ids"]]
    assert records[0]["scores"] == sorted(records[0]["scores"], reverse=True)


def test_predict_scores_are_the_pipelines_probabilities(trained, tmp_path):
    """`scores` are sigmoid probabilities, as `pipeline("text-classification")` gives; `--logits` adds the logits."""
    from transformers import pipeline

    texts = tmp_path / "texts.txt"
    texts.write_text("w3 w40 w50\n")
    output = tmp_path / "top.jsonl"
    assert (
        main(
            ["predict", "--model", str(trained), "--input", str(texts), "--output", str(output), "-k", "3", "--logits"]
        )
        == 0
    )
    record = json.loads(output.read_text())
    assert all(0.0 < score < 1.0 for score in record["scores"])
    assert record["scores"] == pytest.approx([1 / (1 + math.exp(-logit)) for logit in record["logits"]], abs=2e-6)
    served = pipeline("text-classification", model=str(trained), top_k=3)(["w3 w40 w50"])[0]
    assert [entry["label"] for entry in served] == record["labels"]
    assert [entry["score"] for entry in served] == pytest.approx(record["scores"], abs=1e-5)
    assert main(["predict", "--model", str(trained), "--input", str(texts), "--output", str(output), "-k", "3"]) == 0
    assert "logits" not in json.loads(output.read_text())


def test_help_and_usage_errors_load_nothing_heavy(tmp_path):
    """`import haste_hf.cli` and parsing `--help`, `--version`, a light command's `--help` or a usage error import
    neither torch, transformers nor datasets (the CLI answers in about a second)."""
    code = (
        "import sys, haste_hf.cli.parser as cli\n"
        "for argv in (['--help'], ['--version'], ['predict', '--help'], ['evaluate', '--help'], ['push', '--help'],\n"
        "             ['predict', '--model', 'no/such/dir/x', '--output', 'o.jsonl'], ['train'][:0] + ['bogus'],\n"
        "             ['train', '--help'], ['demo', '--help'], ['group', '--help'], ['train', '--learning-rate', 'abc'],\n"
        "             ['train', '--lr', '1e-4', '--no-such-flag'], ['demo', '--pooling', 'max'], ['group', '--fan-in', 'x'],\n"
        "             ['train', '--config', 'config.json']):\n"
        "    try:\n"
        "        cli.parse_args(argv)\n"
        "    except (SystemExit, cli.UsageError):\n"
        "        pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'transformers.pipelines') if m in sys.modules))\n"
    )
    (tmp_path / "config.json").write_text('{"learning_rate": 1e-4, "fan_inn": 8}')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert "haste-hf 0.1.0 (transformers " in result.stdout
    assert "--group-size" in result.stdout and "--learning-rate" in result.stdout  # the train and group --help
    assert "argument --learning_rate/--learning-rate: invalid float value: 'abc'" in result.stderr
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_the_flag_snapshot_is_the_live_parsers():
    """`train_flags.json` holds what `HfArgumentParser` makes of the dataclasses today: a changed field, default or
    help (or another transformers) fails here until the snapshot is regenerated."""
    import dataclasses

    from haste_hf.cli import flags as train_flags
    from haste_hf.recipe import RecipeArguments
    from haste_hf.training.training_args import HasteTrainingArguments

    snapshot = json.loads(train_flags.SNAPSHOT_PATH.read_text(encoding="utf-8"))
    assert snapshot == train_flags.describe_live_flags(), (
        f"train_flags.json is stale: run `{train_flags.REGENERATE_COMMAND}`"
    )
    fields = {
        f.name
        for dataclass in (RecipeArguments, HasteTrainingArguments)
        for f in dataclasses.fields(dataclass)
        if f.init
    }
    assert train_flags.field_names() == fields


@pytest.mark.parametrize("command", ["train", "demo", "group"])
def test_flags_from_the_snapshot_answer_as_the_live_parser(command, monkeypatch, capsys):
    """The same --help, and the same message for a bad value, a bad choice, a bad truth value and an unknown flag."""
    monkeypatch.setenv("COLUMNS", "100")
    snapshot, live = (
        build_parser(command=command, live=live)._subparsers._group_actions[0].choices[command]
        for live in (False, True)
    )
    assert snapshot.format_help() == live.format_help()
    for flags in (
        ["--fan-in", "x"],
        ["--pooling", "max"],
        ["--label-texts", "maybe"],
        ["--fan-inn", "8"],
        ["--max-length"],
    ):
        errors = []
        for parser in (snapshot, live):
            with pytest.raises(SystemExit):
                parser.parse_args(flags)
            errors.append(capsys.readouterr().err)
        assert errors[0] == errors[1] and "error: " in errors[0]


def test_flags_come_from_the_live_parser_under_other_versions_than_the_snapshots(monkeypatch, tmp_path):
    from haste_hf.cli import flags as train_flags

    monkeypatch.setenv(train_flags.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setattr(train_flags, "installed_versions", lambda: {"transformers": "5.999.0", "torch": "2.13.0"})
    train_flags.flag_description.cache_clear()
    try:
        assert train_flags.flag_description()["versions"]["transformers"] == "5.999.0"
    finally:
        train_flags.flag_description.cache_clear()


def test_push_help_names_the_endpoint_and_the_login(monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.example:8080")
    with pytest.raises(SystemExit):
        main(["push", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "http://hub.example:8080" in text and "HF_ENDPOINT" in text and "hf auth login" in text


def test_push_with_a_refused_token_says_how_to_log_in(trained, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_valid_token")
    assert main(["push", "--model", str(trained), "--repo-id", "haste-tester/refused"]) == 1
    error = capsys.readouterr().err
    assert "401" in error and "hf auth login" in error


@pytest.mark.parametrize("command, scored", [("evaluate", True), ("predict", False), ("add-labels", False)])
def test_only_evaluate_takes_the_flags_of_scoring(capsys, command, scored):
    """predict and add-labels compute no metrics: they took --dataset-name and --propensity-a/-b and ignored them."""
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert all((flag in text) == scored for flag in ("--dataset-name", "--propensity-a", "--propensity-b"))


def test_help_states_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: as in training)" in text and "(default: None)" not in text


def test_group_then_train_from_its_file_with_the_default_validation_fraction(dataset_dir, encoder_dir, tmp_path):
    layout_file = tmp_path / "layout.safetensors"
    assert group(dataset_dir, encoder_dir, layout_file, "--group-size", "4", "--head-fraction", "0.1") == 0
    structure = ["--group-size", "4", "--head-fraction", "0.1"]
    arguments = train_on_layout(dataset_dir, encoder_dir, tmp_path / "model", layout_file, *structure)
    arguments[arguments.index("--layout-file")] = "--grouping-file"  # the flag's other name
    assert main(arguments) == 0  # the structure flags agree with the file's (they may also be left out)
    from haste_hf.labels.layout import LabelLayout

    layout = LabelLayout.load(layout_file)
    model = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert model.config.group_size == 4 and model.config.head_label_count == 3
    assert torch.equal(model.output_layer.output_labels, layout.output_labels())


def test_train_refuses_a_layout_of_another_split(dataset_dir, encoder_dir, tmp_path, capsys):
    layout_file = tmp_path / "layout.safetensors"
    flags = ["--group-size", "4", "--grouping", "frequency", "--validation-fraction", "0.2"]
    assert group(dataset_dir, encoder_dir, layout_file, *flags) == 0
    capsys.readouterr()
    assert main(train_on_layout(dataset_dir, encoder_dir, tmp_path / "model", layout_file)) == 1
    assert re.search(
        "^haste-hf train: error: .*another training split.*--validation-fraction", capsys.readouterr().err, re.M
    )
    assert not (tmp_path / "model").exists()


def test_help_explains_every_flag(capsys):
    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert set(subcommands) == {"train", "demo", "evaluate", "predict", "group", "push", "export", "add-labels"}
    for name in subcommands:
        subparser = build_parser(command=name)._subparsers._group_actions[0].choices[name]
        for action in subparser._actions:
            if action.dest != "help":
                assert action.help, f"{name} --{action.dest} has no help"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "--group-size" in capsys.readouterr().out


def test_every_training_argument_is_a_train_flag():
    import dataclasses

    from haste_hf.recipe import RecipeArguments
    from haste_hf.training.training_args import HasteTrainingArguments

    train = build_parser(command="train")._subparsers._group_actions[0].choices["train"]
    flags = {option for action in train._actions for option in action.option_strings}
    for dataclass in (RecipeArguments, HasteTrainingArguments):
        for field in dataclasses.fields(dataclass):
            if field.init:
                assert f"--{field.name.replace('_', '-')}" in flags, field.name


def test_train_flags_short_forms_and_report_to():
    from haste_hf.cli.parser import parse_args

    args = parse_args(
        [
            "train",
            "--lr",
            "1e-3",
            "--epochs=2",
            "--batch-size",
            "8",
            "--report-to",
            "tensorboard",
            "--head-fraction",
            "0.1",
            "--group-size",
            "4",
            "--optim",
            "sgd",
            "--output-dir",
            "out",
        ]
    )
    training, recipe = args.training, args.recipe
    assert (training.learning_rate, training.num_train_epochs, training.per_device_train_batch_size) == (1e-3, 2, 8)
    assert training.report_to == ["tensorboard"] and training.output_dir == "out" and training.seed == 0
    assert (recipe.head_label_fraction, recipe.group_size, recipe.grouping) == (0.1, 4, None)
    # No validation split by default: nothing to evaluate during training, checkpoints each epoch.
    assert args.training.eval_strategy == "no" and args.training.save_strategy == "epoch"
    assert parse_args(["train", "--validation-fraction", "0.1"]).training.eval_strategy == "epoch"
    rules = parse_args(["train", "--bf16", "--eval-steps", "50", "--use-cpu", "--validation-fraction", "0.1"]).training
    assert (rules.bf16, rules.output_layer_dtype) == (True, "bfloat16")
    assert (rules.eval_strategy, rules.save_strategy, rules.eval_steps, rules.save_steps) == ("steps", "steps", 50, 50)
    assert (
        parse_args(["train", "--bf16", "--output-layer-dtype", "float32", "--use-cpu"]).training.output_layer_dtype
        == "float32"
    )
    demo = parse_args(["demo"])
    assert (demo.recipe.encoder, demo.recipe.max_length, demo.training.output_dir) == ("minilm", 32, "haste-demo")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_train_reads_its_flags_from_a_config_file_and_the_command_line_wins(tmp_path, suffix):
    from haste_hf.cli.parser import parse_args

    values = {
        "learning_rate": 3e-4,
        "num_train_epochs": 5,
        "group_size": 8,
        "report_to": ["tensorboard"],
        "grouping": "random",
        "output-dir": str(tmp_path / "from-config"),
    }
    config = tmp_path / f"config{suffix}"
    if suffix == ".json":
        config.write_text(json.dumps(values))
    else:
        import yaml

        config.write_text(yaml.safe_dump(values))
    args = parse_args(["train", "--config", str(config), "--epochs", "7"])
    assert args.training.learning_rate == 3e-4 and args.training.num_train_epochs == 7
    assert args.training.report_to == ["tensorboard"] and args.training.output_dir == str(tmp_path / "from-config")
    assert (args.recipe.group_size, args.recipe.grouping) == (8, "random")
    config.write_text(json.dumps({"learning_rat": 1e-3}) if suffix == ".json" else "learning_rat: 0.001\n")
    with pytest.raises(UsageError, match="unknown key 'learning_rat' \\(did you mean 'learning_rate'\\?\\)"):
        parse_args(["train", "--config", str(config)])


def test_group_defaults_to_the_papers_head_share(dataset_dir, encoder_dir, tmp_path):
    from haste_hf.labels.layout import LabelLayout

    layout_file = tmp_path / "layout.safetensors"
    assert group(dataset_dir, encoder_dir, layout_file, "--grouping", "random") == 0
    layout = LabelLayout.load(layout_file)
    assert (layout.head_label_count, layout.group_size, layout.strategy) == (1, 16, "random")  # round(3% of 30) = 1


def test_group_names_the_train_options_it_ignores(dataset_dir, encoder_dir, tmp_path):
    from transformers.testing_utils import CaptureLogger
    from transformers.utils import logging

    with CaptureLogger(logging.get_logger("transformers.haste_hf.cli")) as captured:
        layout_file = tmp_path / "layout.safetensors"
        assert group(dataset_dir, encoder_dir, layout_file, "--grouping", "random", "--fan-in", "8") == 0
    assert "Ignored by `haste-hf group` (they are `train` options): --fan-in." in captured.out


def test_train_refuses_structure_flags_that_contradict_the_layout_file(dataset_dir, encoder_dir, tmp_path, capsys):
    layout_file = tmp_path / "layout.safetensors"
    assert group(dataset_dir, encoder_dir, layout_file, "--group-size", "4", "--grouping", "frequency") == 0
    base = train_on_layout(dataset_dir, encoder_dir, tmp_path / "model", layout_file)
    for flags, message in (
        (["--group-size", "8"], r"`group_size` \(8\) differs from the label layout's G \(4\)"),
        (["--head-fraction", "0.5"], "gives a head of 15 labels, the label layout's has 1"),
        (["--grouping", "semantic"], "groups are frequency, not semantic"),
    ):
        capsys.readouterr()
        assert main(base + flags) == 1
        assert re.search(f"^haste-hf train: error: .*{message}", capsys.readouterr().err, re.M)


def test_version(capsys):
    import torch
    import transformers

    import haste_hf

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"haste-hf {haste_hf.__version__} (transformers {transformers.__version__}, torch {torch.__version__})"
    )


def test_a_config_file_given_as_config_equals_path_is_read_whole_even_with_an_equals_sign_in_its_name(tmp_path):
    from haste_hf.cli.parser import parse_args

    config = tmp_path / "lr=3e-4.json"
    config.write_text(json.dumps({"learning_rate": 3e-4, "group_size": 8}))
    args = parse_args(["train", f"--config={config}"])
    assert args.training.learning_rate == 3e-4 and args.recipe.group_size == 8
