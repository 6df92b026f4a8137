"""`benchmarks/recipe_study.py`'s levers are `haste-hf train` command lines that parse today: a study spends device
time, so a lever whose flag was renamed or removed must fail here, not on the device."""

from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from haste_hf.cli.parser import parse_args


STUDY = load_benchmark("recipe_study")


def train_argv(variant, dataset_dir, output_dir):
    """The study's command line of `variant`, for a CPU: without `--bf16` (which the device has and a CPU refuses)."""
    argv = STUDY.command_line(STUDY.variant_flags(variant), Path(dataset_dir), "minilm", output_dir, seed=0, workers=1)
    return [arg for arg in argv if arg != "--bf16"] + ["--use-cpu"]


@pytest.mark.parametrize("lever", sorted(STUDY.LEVERS))
def test_every_lever_is_a_train_command_line(lever, dataset_dir, tmp_path):
    for variant in (f"defaults+{lever}", f"bench+{lever}"):
        argv = train_argv(variant, dataset_dir, tmp_path / "run")
        args = parse_args(argv)
        for flag, value in STUDY.LEVERS[lever].items():
            if flag.startswith("--"):
                at = argv.index(flag) + 1
                assert value is None or argv[at : at + len(value.split())] == value.split(), (variant, flag)
        assert args.recipe.data == str(dataset_dir)


def test_the_label_text_levers_turn_their_options_on(dataset_dir, tmp_path):
    recipe = parse_args(train_argv("defaults+labelinit3+labelgroup", dataset_dir, tmp_path)).recipe
    assert (recipe.init_from_label_texts, recipe.label_text_init_scale, recipe.label_text_grouping_below) == (
        True,
        3.0,
        5,
    )


def test_the_tail_study_levers_turn_their_options_on(dataset_dir, tmp_path):
    args = parse_args(train_argv("defaults+bands1-5+tailx2+rewirenorm+F256+G4", dataset_dir, tmp_path))
    assert (args.recipe.frequency_bands, args.recipe.fan_in, args.recipe.group_size) == ([1, 5], 256, 4)
    assert (args.training.output_tail_lr_scale, args.training.rewiring_score) == (2.0, "label_normalized")
    assert parse_args(train_argv("defaults+olddefaults+tailbias", dataset_dir, tmp_path)).recipe.tail_bias
    args = parse_args(train_argv("defaults+F384", dataset_dir, tmp_path))
    assert (args.recipe.fan_in, args.training.rewiring_interval) == (384, 0)


def test_olddefaults_measures_the_recipe_before_the_tail_defaults(dataset_dir, tmp_path):
    """`defaults` passes no recipe flag (the new defaults of issue 39 by construction); `defaults+olddefaults` and
    `before` train the tail as before them: one SGD rate, no tail bias, random rows."""
    now = parse_args(train_argv("defaults", dataset_dir, tmp_path))
    assert (now.training.output_tail_lr_scale, now.recipe.tail_bias, now.recipe.init_from_label_texts) == (
        2.0,
        True,
        True,
    )
    for variant in ("defaults+olddefaults", "before"):
        old = parse_args(train_argv(variant, dataset_dir, tmp_path))
        assert (old.training.output_tail_lr_scale, old.recipe.tail_bias, old.recipe.init_from_label_texts) == (
            1.0,
            False,
            False,
        ), variant


def test_a_run_longer_than_a_device_call_resumes_from_its_checkpoint(dataset_dir, tmp_path):
    flags = STUDY.variant_flags("defaults+epochs20")
    fresh = STUDY.command_line(flags, Path(dataset_dir), "minilm", tmp_path, 0, 1)
    again = STUDY.command_line(flags, Path(dataset_dir), "minilm", tmp_path, 0, 1, resume=True)
    assert "--overwrite-output-dir" in fresh and "--resume-from-checkpoint" not in fresh
    assert "--overwrite-output-dir" not in again
    args = parse_args([arg for arg in again if arg != "--bf16"] + ["--use-cpu"])
    assert args.training.resume_from_checkpoint and not args.recipe.overwrite_output_dir


def test_jobs_name_their_dataset_variant_and_seeds():
    args = STUDY.argparse.Namespace(
        jobs=[STUDY.parse_job("deps:defaults+labelinit:0,1,2"), STUDY.parse_job("tags:defaults+F192:0")],
        variants=["before"],
        datasets=["deps"],
        seeds=[5],
    )
    assert STUDY.study_jobs(args) == [
        ("defaults+labelinit", "deps", 0),
        ("defaults+labelinit", "deps", 1),
        ("defaults+labelinit", "deps", 2),
        ("defaults+F192", "tags", 0),
    ]
    for bad in ("deps:defaults", "deps:defaults:x", "deps:defaults+nolever:0"):
        with pytest.raises((STUDY.argparse.ArgumentTypeError, ValueError)):
            STUDY.parse_job(bad)


def test_a_run_records_where_its_points_come_from_by_training_frequency(dataset_dir, encoder_dir, tmp_path):
    """The worker trains through `haste-hf train` and then writes `by_frequency`: the diagnosis of the tail study
    (issue 39). Its shares add up to the run's own test metrics, so it scores the folder as the run scored it."""
    argv = STUDY.command_line(
        STUDY.variant_flags("defaults"), Path(dataset_dir), str(encoder_dir), tmp_path / "run", seed=0, workers=0
    )
    argv += [
        "--use-cpu",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--max-length",
        "64",
    ]
    result_file = tmp_path / "result.json"
    assert STUDY.run_worker(argv, result_file) == 0
    result = STUDY.json.loads(result_file.read_text())
    table = result["by_frequency"]
    assert list(table) == ["head", "0", "1", "2-5", "6-20", "21-100", "101+"]
    assert sum(row["test_pairs"] for row in table.values()) > 0
    assert sum(row["P@5 share"] for row in table.values()) == pytest.approx(result["metrics"]["P@5"], abs=1e-9)
    assert sum(row["PSP@5 share"] for row in table.values()) == pytest.approx(result["metrics"]["PSP@5"], abs=1e-9)
    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    result_file.rename(runs / "tiny__defaults__s0.json")
    assert "by training frequency" in STUDY.report(tmp_path / "out")
