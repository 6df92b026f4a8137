"""The examples run as users run them (against the test Hub where they publish)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch import data_flags

from haste_hf.cli import main


EXAMPLES = Path(__file__).parent.parent / "examples"


def test_hub_example_pushes_and_loads_with_and_without_the_package(hub, tmp_path, dataset_dir, encoder_dir):
    model_dir = tmp_path / "model"
    arguments = [
        "train",
        *data_flags(dataset_dir),
        "--encoder",
        str(encoder_dir),
        "--output-dir",
        str(model_dir),
        "--max-steps",
        "3",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--validation-fraction",
        "0",
    ]
    assert main(arguments) == 0
    repo_id = f"{hub.user}/example-hub"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "hub.py"), "--model", str(model_dir), "--repo-id", repo_id, "--branch", "v1"],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(same as above: True)" in result.stdout, result.stdout


@pytest.mark.slow
def test_train_xmc_repository_reads_the_dataset_from_its_folder(tmp_path, dataset_dir, encoder_dir):
    """The script downloads nothing: it trains on the folder given (here a tiny raw-text dataset and encoder), saves
    the label layout once, and reuses it on a second run."""
    script = EXAMPLES / "train_xmc_repository.py"
    assert "downloads nothing" in script.read_text() and "XMLRepository.html" in script.read_text()
    command = [sys.executable, str(script), "--data", str(dataset_dir), "--encoder", str(encoder_dir)]
    command += ["--output-dir", str(tmp_path / "out"), "--epochs", "1", "--group-size", "4", "--fan-in", "8"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'P@1'" in result.stdout and (tmp_path / "out" / "label_layout.safetensors").is_file()
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.slow
def test_quickstart_runs_as_written(tmp_path, encoder_dir, monkeypatch, capsys):
    """The quickstart, with the tiny encoder for MiniLM and a few steps for its two epochs."""
    code = (EXAMPLES / "quickstart.py").read_text()
    for original, replacement in (
        ('encoder="minilm"', f"encoder={str(encoder_dir)!r}"),
        ('"num_train_epochs": 2', '"max_steps": 3, "use_cpu": True'),
        ("fan_in=64", "fan_in=8"),
    ):
        assert original in code, original
        code = code.replace(original, replacement)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    exec(compile(code, "quickstart.py", "exec"), namespace)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines[-2].split(",")) == 3 and len(lines[-1].split(",")) == 3  # 3 label names per text
    assert namespace["reloaded"].config.label_count == namespace["run"].model.config.label_count == 452
