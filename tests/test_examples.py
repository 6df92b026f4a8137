"""The examples run as users run them (against the test Hub where they publish)."""

import os
import subprocess
import sys
from pathlib import Path

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
