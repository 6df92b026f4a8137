"""Two CPU processes under torchrun: with `--use_cpu` they train without the deprecation warnings of torch 2.13
(the tensor collectives' old names, DDP's `broadcast_buffers`); without it each process says in one line what to
pass, with no traceback of its own."""

import gzip
import json
import os
import subprocess
import sys

import pytest
import torch
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
from transformers import BertModel


DEPRECATED = ("all_gather_into_tensor", "reduce_scatter_tensor", "broadcast_buffers")


@pytest.fixture(scope="module")
def cli_arguments(tmp_path_factory):
    folder = tmp_path_factory.mktemp("launch")
    torch.manual_seed(0)
    BertModel(tiny_encoder_config("bert")).save_pretrained(folder / "encoder")
    tiny_tokenizer(folder / "encoder")
    (folder / "data").mkdir()
    for name, rows in (("trn", planted_texts(30, 48, seed=0)), ("tst", planted_texts(30, 16, seed=1))):
        with gzip.open(folder / "data" / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(rows):
                f.write(json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}))
                f.write("\n")
    with gzip.open(folder / "data" / "lbl.json.gz", "wt") as f:
        for label in range(30):
            f.write(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n")
    arguments = ["train", "--data", str(folder / "data"), "--encoder", str(folder / "encoder"), "--epochs", "1"]
    arguments += ["--group-size", "4", "--fan-in", "8", "--head-fraction", "0.5", "--max-length", "16"]
    return [*arguments, "--batch-size", "8", "--rewiring-interval", "2"]


def torchrun(arguments, cwd):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*command, "-m", "haste_hf.cli", *arguments], env=env, capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.mark.slow
def test_two_cpu_processes_train_without_deprecation_warnings(cli_arguments, tmp_path):
    result = torchrun([*cli_arguments, "--use_cpu", "--output-dir", str(tmp_path / "out")], tmp_path)
    assert result.returncode == 0, result.stderr[-6000:]
    warned = [line for line in result.stderr.splitlines() if any(name in line for name in DEPRECATED)]
    assert not warned, warned


@pytest.mark.slow
def test_two_cpu_processes_without_use_cpu_say_so_in_one_line_each(cli_arguments, tmp_path):
    result = torchrun([*cli_arguments, "--output-dir", str(tmp_path / "out")], tmp_path)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("haste-hf train: error: Launched as 2")]
    assert len(errors) == 2 and "--use_cpu" in errors[0], result.stderr[-6000:]
    # The launcher reports the failed processes in its own traceback; the processes print none.
    assert "RuntimeError" not in result.stderr and result.stderr.count("Traceback (most recent call last)") <= 1
