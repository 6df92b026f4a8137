"""Settings that used to be taken in silence: a chunk size for a chunked backward that is off, a propensity of NaN
or <= 0 in a folder's `evaluation_settings.json`, a resume under other label names, empty and repeated label
names, a flag only a stale snapshot knows, and a missing flag snapshot (`train --help` crashed), in the source
tree and in the built wheel."""

import importlib.util
import json
import math
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from datasets import Dataset
from tiny_encoders import planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_model, make_tiny_trainer
from transformers.testing_utils import CaptureLogger

from haste_hf.cli import flags as train_flags
from haste_hf.cli import main
from haste_hf.evaluation import EVALUATION_SETTINGS_FILE, saved_evaluation_settings
from haste_hf.modeling import modeling_haste
from haste_hf.training.training_args import HasteTrainingArguments


REPOSITORY = Path(__file__).resolve().parents[2]


def test_a_chunk_size_without_the_chunked_backward_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"`output_loss_chunk_labels` \(64\) sizes the chunks .* which is off"):
        HasteTrainingArguments(
            output_dir=str(tmp_path),
            output_loss_chunk_labels=64,
            output_chunked_backward=False,
            output_fused_update=False,
        )
    chunked = HasteTrainingArguments(
        output_dir=str(tmp_path), output_loss_chunk_labels=64, output_chunked_backward=True
    )
    assert chunked.output_loss_chunk_labels == 64


def test_the_command_line_refuses_it_in_one_line(tmp_path, capsys):
    off = ["--output-chunked-backward", "false", "--output-fused-update", "false"]
    status = main(["train", "--output-dir", str(tmp_path / "out"), "--output-loss-chunk-labels", "64", *off])
    assert status == 2
    assert "output_chunked_backward" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [math.nan, -1.0, 0])
@pytest.mark.parametrize("name", ["propensity_a", "propensity_b"])
def test_evaluation_settings_with_a_propensity_the_flags_refuse_are_refused(tmp_path, name, value):
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(json.dumps({name: value}))
    with pytest.raises(ValueError, match=rf"{EVALUATION_SETTINGS_FILE}: '{name}' is .*, expected a number > 0"):
        saved_evaluation_settings(tmp_path)


def test_a_resume_under_other_label_names_is_refused(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    train = Dataset.from_list(planted_texts(40, 16, seed=0))
    arguments = dict(per_device_train_batch_size=8, max_steps=2, save_strategy="steps", save_steps=2)

    def trainer(names):
        model = make_tiny_model(label_count=40)
        model.set_label_names(names)
        return make_tiny_trainer(tmp_path / "run", tokenizer, train, model, **arguments)

    names = [f"tag {i}" for i in range(40)]
    trainer(names).train()
    swapped = [names[1], names[0], *names[2:]]
    with pytest.raises(ValueError, match=r"checkpoint-2 was trained under other label names: label 0 is 'tag 0' there"):
        trainer(swapped).train(resume_from_checkpoint=True)
    trainer(names).train(resume_from_checkpoint=True)  # the same names resume


def test_empty_names_become_label_ids_and_repeats_are_named_in_a_warning():
    model = make_tiny_model(label_count=6)
    with CaptureLogger(modeling_haste.logger) as captured:
        model.set_label_names(["a", "", "b", "a", "  ", "c"])
    assert model.label_names == ["a", "LABEL_1", "b", "a", "LABEL_4", "c"]
    assert "2 empty name(s)" in captured.out and "'a' for labels 0 and 3" in captured.out
    with pytest.raises(ValueError, match="`label_names` has a string for 6 labels"):
        model.set_label_names("abcdef")


def test_a_flag_only_a_stale_snapshot_knows_is_refused_not_dropped(monkeypatch, capsys):
    description = json.loads(json.dumps(train_flags.flag_description()))
    extra = dict(description["RecipeArguments"][0], option_strings=["--retired-flag"], dest="retired_flag")
    description["RecipeArguments"].append(extra)
    monkeypatch.setattr(train_flags, "flag_description", lambda: description)
    with pytest.raises(SystemExit):
        main(["train", "--retired-flag", "5", "--output-dir", "unused"])
    assert "unrecognized arguments: --retired-flag 5" in capsys.readouterr().err


def test_train_help_reads_the_live_flags_without_a_snapshot(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(train_flags, "SNAPSHOT_PATH", tmp_path / "missing.json")
    train_flags.flag_description.cache_clear()
    try:
        with pytest.raises(SystemExit) as exit:
            main(["train", "--help"])
    finally:
        train_flags.flag_description.cache_clear()
    assert exit.value.code == 0 and "--learning-rate" in capsys.readouterr().out


def test_the_built_wheel_carries_the_snapshot_and_answers_help_without_it(tmp_path):
    # Built from a copy of the sources, so that setuptools' build/ folder is not left in the checkout; with the
    # installed setuptools where there is one (offline), else pip's isolated build environment.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("haste_hf", "csrc", "model_cards"):
        shutil.copytree(REPOSITORY / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPOSITORY / name, source / name)
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", tmp_path, source],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("haste_hf-*.whl")
    assert "haste_hf/cli/train_flags.json" in zipfile.ZipFile(wheel).namelist()
    installed = tmp_path / "installed"
    zipfile.ZipFile(wheel).extractall(installed)
    (installed / "haste_hf" / "cli" / "train_flags.json").unlink()  # as a package built without it
    # Without `site` (-S), so that the editable install of the source tree does not answer instead.
    script = (
        "import sys; sys.path[:0] = sys.argv[1:]; import haste_hf; "
        "assert haste_hf.__file__.startswith(sys.argv[1]), haste_hf.__file__; "
        "from haste_hf.cli import main; main(['train', '--help'])"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", script, str(installed), *site.getsitepackages()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--learning-rate" in result.stdout


def test_a_chunk_size_alone_turns_the_chunked_backward_on_where_the_plan_would_not(tmp_path):
    from tiny_haste import make_tiny_model

    from haste_hf.training.memory_plan import plan_memory

    def planned(**fields):
        args = HasteTrainingArguments(output_dir=str(tmp_path), use_cpu=True, **fields)
        return plan_memory(args, make_tiny_model(), tokens=8, sharded=False, device_memory=None)

    assert planned(output_loss_chunk_labels=64).output_chunked_backward
    assert not planned().output_chunked_backward
