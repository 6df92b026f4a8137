"""Small factories the tests share: `haste-hf` argument lists, in-process command-line runs, torchrun launches
and the tolerances their results are compared with."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch


TESTS = Path(__file__).parent
# fp32 on the CPU: the processes add the same terms in another order, nothing else differs.
LOSS_TOLERANCE = dict(rtol=1e-6, atol=1e-5)
WEIGHT_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def data_flags(dataset_dir):
    """The data flags of `train` and `evaluate` on the tiny dataset."""
    # 6 tokens cut most texts (up to 8 with [CLS] and [SEP]): a wrong length at evaluation shows in the metrics.
    return ["--data", str(dataset_dir), "--max-length", "6", "--eval-batch-size", "16"]


def train_flags(data, encoder_dir, output_dir, *extra):
    """`haste-hf train` of a tiny model for one epoch, without rewiring."""
    return [
        "train",
        "--data",
        data,
        "--encoder",
        encoder_dir,
        "--output-dir",
        output_dir,
        "--max-length",
        "16",
        "--eval-batch-size",
        "16",
        "--batch-size",
        "16",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--epochs",
        "1",
        "--rewiring-interval",
        "0",
        *extra,
    ]


def run_cli(capsys, argv):
    """Exit status and stderr lines of `haste-hf ARGV`."""
    from haste_hf.cli import main

    capsys.readouterr()  # what the test's own setup printed
    try:
        status = main([str(arg) for arg in argv])
    except SystemExit as exit:
        status = exit.code
    # Progress bars (loading weights, predicting) and their cursor moves are not messages.
    lines = (re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).strip() for line in capsys.readouterr().err.split("\n"))
    return status, [line for line in lines if line and not re.search(r"\d+%\|", line)]


def assert_one_line_error(status, lines, expected_status, command, *fragments):
    assert status == expected_status, lines
    assert len(lines) == 1 and lines[0].startswith(f"haste-hf {command}: error: "), lines
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def torchrun(script_arguments, cwd, processes=2, timeout=600):
    """`torchrun --standalone` of `processes` CPU processes (the test helpers importable); fails the test with the
    end of stderr unless every process exits 0."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(processes),
        *[str(argument) for argument in script_arguments],
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    assert result.returncode == 0, result.stderr[-6000:]
    return result


def assert_states_close(
    actual: dict, expected: dict, exact_names=("output_layer.tail.supports", "output_layer.output_labels")
):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        if name in exact_names:
            assert torch.equal(actual[name], value), name
        else:
            torch.testing.assert_close(actual[name], value, **WEIGHT_TOLERANCE, msg=name)
