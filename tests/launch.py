"""Small factories the tests share: `haste-hf` argument lists, in-process command-line runs, torchrun launches
and the tolerances their results are compared with."""

import re
from contextlib import contextmanager
from pathlib import Path

import torch
from processes import TESTS, torchrun  # noqa: F401  (the launches every torchrun test shares)


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


@contextmanager
def gloo_group_of_one(folder: Path):
    """A one-process gloo group (its store a file in `folder`) for the lines inside; the sharded layer's collectives
    run on it as on a rank of a real group. Conftest's `one_process_group` fixture holds one for a whole test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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


def assert_states_close(
    actual: dict, expected: dict, exact_names=("output_layer.tail.supports", "output_layer.output_labels")
):
    assert set(actual) == set(expected)
    for name, value in expected.items():
        if name in exact_names:
            assert torch.equal(actual[name], value), name
        else:
            torch.testing.assert_close(actual[name], value, **WEIGHT_TOLERANCE, msg=name)


def cli_train_arguments(folder: Path) -> list[str]:
    """`haste-hf train` of a tiny BERT (no dropout) on 30 planted labels, written into `folder` (no output folder,
    batch size or device: the caller's)."""
    import gzip
    import json

    from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
    from transformers import BertModel

    config = tiny_encoder_config("bert")
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder / "encoder")
    tiny_tokenizer(folder / "encoder")
    data = folder / "data"
    data.mkdir()
    for name, rows in (("trn", planted_texts(30, 160, seed=0)), ("tst", planted_texts(30, 41, seed=1))):
        with gzip.open(data / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(rows):
                f.write(
                    json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}) + "\n"
                )
    with gzip.open(data / "lbl.json.gz", "wt") as f:
        for label in range(30):
            f.write(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n")
    return [
        "train",
        "--data",
        str(data),
        "--encoder",
        str(folder / "encoder"),
        "--epochs",
        "6",
        "--group-size",
        "4",
        "--fan-in",
        "8",
        "--head-fraction",
        "0.5",
        "--rewiring-interval",
        "3",
        "--max-length",
        "16",
        "--eval-batch-size",
        "16",
        "--propensity-a",
        "0.5",
        "--propensity-b",
        "0.4",
        "--lr",
        "3e-3",
        "--output-lr",
        "0.5",
    ]


def assert_momentum_in_shards(checkpoint: Path) -> None:
    """Each rank's shard of `checkpoint` holds the momentum of its rows (head 3 + 2 rows, tail 5 + 4 groups);
    optimizer.pt holds none of it."""
    from safetensors.torch import load_file

    from haste_hf.modeling.output_shards import output_shard_file

    names = [f"optimizer.output_layer.{name}.momentum_buffer" for name in ("head.weight", "head.bias", "tail.weight")]
    shares = [load_file(checkpoint / output_shard_file(rank, 2)) for rank in range(2)]
    shapes = [
        {name: tuple(value.shape) for name, value in share.items() if name.startswith("optimizer.")} for share in shares
    ]
    assert shapes == [dict(zip(names, [(3, 32), (3,), (5, 4, 8)])), dict(zip(names, [(2, 32), (2,), (4, 4, 8)]))]
    output_state = torch.load(checkpoint / "optimizer.pt", weights_only=True)["output"]["state"]
    assert not [
        value for entry in output_state.values() for value in entry.values() if torch.is_tensor(value) and value.dim()
    ]


def whole_state(folder) -> dict:
    from haste_hf import HasteForExtremeClassification

    return HasteForExtremeClassification.from_pretrained(folder).state_dict()
