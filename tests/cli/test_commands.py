"""`haste_hf.cli.commands` apart from the runs it starts: the device and processes a command runs on, the summary
table, the checks of a split and of label names, the input texts, the copy that keeps a link, and how `main` turns
each kind of error into a status and one line."""

import os
import pickle
import socket
import sys
import types

import pytest
import torch
import torch.distributed as dist

from haste_hf import evaluation
from haste_hf.cli import commands
from haste_hf.cli.errors import UsageError


def test_one_process_on_a_cpu_runs_on_the_cpu_as_the_main_process(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert commands.default_device() == torch.device("cpu")
    assert commands.launched_processes() == 1 and commands.is_main_process() is True
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert commands.launched_processes() == 3


@pytest.mark.parametrize("rank, main", [(0, True), (1, False), (2, False)])
def test_only_rank_0_is_the_main_process(monkeypatch, rank, main):
    monkeypatch.setattr(evaluation, "process_rank_and_count", lambda: (rank, 3))
    assert commands.is_main_process() is main


@pytest.fixture
def one_process_group_environment(monkeypatch):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1").items():
        monkeypatch.setenv(name, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_joining_the_process_group_on_a_cpu_is_a_gloo_group_joined_once(one_process_group_environment):
    assert commands.join_process_group() == torch.device("cpu")
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    group = dist.group.WORLD
    assert commands.join_process_group() == torch.device("cpu") and dist.group.WORLD is group


def test_a_command_that_starts_a_process_group_ends_it_and_a_callers_group_is_left(
    one_process_group_environment, monkeypatch
):
    monkeypatch.setattr(commands, "handler_of", lambda command: lambda args: commands.join_process_group() and 7)
    assert commands._run_command(types.SimpleNamespace(command="evaluate")) == 7
    assert not dist.is_initialized()
    dist.init_process_group("gloo")
    assert commands._run_command(types.SimpleNamespace(command="evaluate")) == 7
    assert dist.is_initialized()


def test_without_torch_loaded_there_is_no_process_group(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    assert commands._process_group_started() is False


def test_the_summary_is_a_table_of_the_families_measured_at_each_k_then_the_extra_lines():
    metrics = {"P@1": 0.5, "P@3": 0.25, "P@5": 0.125, "nDCG@1": 0.5, "R@1": 0.9}
    lines = commands.format_summary("Test metrics (%)", metrics, {"steps": 8, "grouping": "random"}).split("\n")
    rule = "-" * 38
    assert lines == [
        "Test metrics (%)",
        rule,
        "                @1        @3        @5",
        "P            50.00     25.00     12.50",
        "nDCG         50.00                    ",
        rule,
        "steps: 8",
        "grouping: random",
    ]
    assert commands.format_summary("t", {}).split("\n") == ["t", rule, "                @1        @3        @5", rule]


def test_a_split_the_data_does_not_have_is_refused_naming_the_splits():
    data = types.SimpleNamespace(splits={"train": [], "test": []})
    commands.check_split(types.SimpleNamespace(split="test"), data)
    with pytest.raises(
        UsageError, match=r"--split: 'validation' is not a split of the dataset \(splits: test, train\)"
    ):
        commands.check_split(types.SimpleNamespace(split="validation"), data)


def model_with(names, count=3):
    return types.SimpleNamespace(label_names=names, config=types.SimpleNamespace(label_count=count))


def data_with(names, count=3):
    return types.SimpleNamespace(label_texts=names, label_count=count)


@pytest.mark.parametrize(
    "model_names, data_names, model_count, data_count, match",
    [
        (["a", "b", "c"], ["a", "b", "c"], 3, 3, True),
        (None, ["a", "b", "c"], 3, 3, True),
        (["a", "b", "c"], None, 3, 3, True),
        (None, None, 3, 3, True),
        (["a", "b", "c"], ["a", "c", "b"], 3, 3, False),
        (None, None, 3, 4, False),
        (["a", "b", "c"], ["a", "b", "c"], 3, 4, False),
    ],
)
def test_labels_match_in_count_and_in_names_where_both_have_names(
    model_names, data_names, model_count, data_count, match
):
    assert commands.labels_match(model_with(model_names, model_count), data_with(data_names, data_count)) is match


def test_label_names_that_differ_are_refused_naming_how_many_and_the_first_unless_ignored():
    args = types.SimpleNamespace(model="out", ignore_label_names=False)
    model, data = model_with(["a", "b", "c", "d", "e"], 5), data_with(["a", "x", "c", "y", "z"], 5)
    with pytest.raises(UsageError, match=r"3 of 5 names differ \(label 1 is 'b' in the model, 'x' in the dataset\)"):
        commands.check_label_names(args, model, data)
    commands.check_label_names(types.SimpleNamespace(model="out", ignore_label_names=True), model, data)
    commands.check_label_names(args, model, data_with(["a", "b", "c", "d", "e"], 5))
    commands.check_label_names(args, model_with(None, 5), data)
    commands.check_label_names(args, model, data_with(None, 5))


def test_texts_are_read_one_a_line_blank_lines_kept(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("first\n\nthird é\n", encoding="utf-8")
    assert commands.read_texts(str(path)) == ["first", "", "third é"]


@pytest.mark.parametrize(
    "content, line, column",
    [(b"\xff starts", 1, 1), (b"ok\nab\xfe", 2, 3), (b"\nab\xfe", 2, 3), (b"one\ntwo\nthree \xc3(", 3, 7)],
)
def test_a_text_file_that_is_not_utf8_is_refused_naming_its_line_byte_and_column(tmp_path, content, line, column):
    path = tmp_path / "texts.txt"
    path.write_bytes(content)
    with pytest.raises(
        UsageError, match=rf"texts\.txt line {line} is not UTF-8 text \(.*: byte 0x.. at column {column}\)"
    ):
        commands.read_texts(str(path))


def test_the_byte_named_is_the_one_that_is_not_utf8(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"fine\nabc\xfedef\n")
    with pytest.raises(UsageError, match=r"line 2 .*byte 0xfe at column 4\)"):
        commands.read_texts(str(path))


def test_an_empty_text_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(UsageError, match=r"argument --input: .*empty\.txt holds no texts \(one text per line\)"):
        commands.read_texts(str(tmp_path / "empty.txt"))


def test_a_copy_keeps_a_link_a_link_copies_a_file_and_refuses_what_is_neither(tmp_path):
    (tmp_path / "card.md").write_text("# card")
    commands.copy_keeping_a_link(tmp_path / "card.md", tmp_path / "copy.md")
    assert (tmp_path / "copy.md").read_text() == "# card" and not (tmp_path / "copy.md").is_symlink()
    (tmp_path / "link.md").symlink_to("/etc/hostname")
    commands.copy_keeping_a_link(tmp_path / "link.md", tmp_path / "copied-link.md")
    assert os.readlink(tmp_path / "copied-link.md") == "/etc/hostname"
    commands.copy_keeping_a_link(tmp_path / "missing.md", tmp_path / "nothing.md")
    assert not (tmp_path / "nothing.md").exists() and not (tmp_path / "nothing.md").is_symlink()
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="pipe is not a regular file: remove it, then run the command again"):
        commands.copy_keeping_a_link(tmp_path / "pipe", tmp_path / "from-pipe")


def test_a_copy_from_a_path_that_cannot_be_opened_says_why(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        commands.copy_keeping_a_link(tmp_path / "file" / "below", tmp_path / "copy")


@pytest.fixture
def push(tmp_path):
    """A `push` command line that parses (its handler is replaced in each test)."""
    return ["push", "--model", str(tmp_path), "--repo-id", "me/model"]


@pytest.mark.parametrize(
    "error, status, line",
    [
        (UsageError("argument --x: bad"), 2, "haste-hf push: error: argument --x: bad"),
        (ValueError("a\n  refused\nfile"), 1, "haste-hf push: error: a refused file"),
        (FloatingPointError("diverged"), 1, "haste-hf push: error: diverged"),
        (pickle.UnpicklingError("bad pickle"), 1, "bad pickle (a damaged or mismatched weights file; HASTE_HF_DEBUG=1"),
        (KeyboardInterrupt(), 130, "haste-hf push: interrupted"),
    ],
)
def test_each_kind_of_error_is_one_line_and_its_status(monkeypatch, capsys, push, error, status, line):
    def failing(args):
        raise error

    monkeypatch.delenv("HASTE_HF_DEBUG", raising=False)
    monkeypatch.setattr(commands, "handler_of", lambda command: failing)
    assert commands.main(push) == status
    err = capsys.readouterr().err
    assert line in err and len(err.strip().splitlines()) == 1


def test_an_unexpected_error_and_any_error_under_debug_show_their_traceback(monkeypatch, push):
    def failing(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(commands, "handler_of", lambda command: failing)
    monkeypatch.delenv("HASTE_HF_DEBUG", raising=False)
    with pytest.raises(RuntimeError, match="a bug"):
        commands.main(push)
    monkeypatch.setattr(commands, "handler_of", lambda command: lambda args: (_ for _ in ()).throw(ValueError("v")))
    monkeypatch.setenv("HASTE_HF_DEBUG", "1")
    with pytest.raises(ValueError, match="v"):
        commands.main(push)


def test_a_finished_command_returns_its_handlers_status(monkeypatch, push):
    monkeypatch.delenv("HASTE_HF_DEBUG", raising=False)
    monkeypatch.setattr(commands, "handler_of", lambda command: lambda args: 0 if args.command == "push" else 9)
    assert commands.main(push) == 0
    monkeypatch.setenv("HASTE_HF_DEBUG", "1")
    assert commands.main(push) == 0


def test_a_usage_error_names_the_command_given_and_exits_2(capsys):
    assert commands.main(["train", "--config", "/nonexistent/run.yaml"]) == 2
    assert capsys.readouterr().err == "haste-hf train: error: argument --config: no file '/nonexistent/run.yaml'\n"


@pytest.mark.parametrize("argv", [["--flag-first"], []])
def test_a_usage_error_before_any_command_names_none(monkeypatch, capsys, argv):
    def refused(argv):
        raise UsageError("argument --flag-first: refused")

    monkeypatch.setattr(commands, "parse_args", refused)
    assert commands.main(argv) == 2
    assert capsys.readouterr().err == "haste-hf: error: argument --flag-first: refused\n"


def test_the_arguments_default_to_the_command_lines(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["haste-hf", "train", "--config", "/nonexistent/run.yaml"])
    assert commands.main() == 2
    assert capsys.readouterr().err.startswith("haste-hf train: error: argument --config")


@pytest.mark.parametrize("logits, names", [(True, ["zero", "one", "two"]), (False, None)])
def test_predictions_are_written_one_json_line_a_text_scores_as_sigmoids_to_6_places(
    tmp_path, monkeypatch, capsys, logits, names
):
    import json

    import numpy as np

    (tmp_path / "texts.txt").write_text("first\nsecond\n")
    model = types.SimpleNamespace(label_names=names, config=types.SimpleNamespace(label_count=3))
    monkeypatch.setattr(commands, "load_trained", lambda args: (model, "tokenizer"))
    raw = np.array([[2.123456789, -0.5], [0.0, -1.987654321]], dtype=np.float32)
    monkeypatch.setattr(evaluation, "predict_top_k", lambda *args: (np.array([[2, 0], [1, 2]]), raw))
    args = types.SimpleNamespace(
        input=str(tmp_path / "texts.txt"),
        k=2,
        logits=logits,
        output=str(tmp_path / "out.jsonl"),
        eval_batch_size=8,
        max_length=16,
    )
    assert commands.command_predict(args) == 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    sigmoid = 1 / (1 + np.exp(-raw.astype(np.float64)))
    assert [record["label_ids"] for record in records] == [[2, 0], [1, 2]]
    assert [record["scores"] for record in records] == [[round(s, 6) for s in row] for row in sigmoid.tolist()]
    if logits:
        assert [record["logits"] for record in records] == [[round(s, 6) for s in row] for row in raw.tolist()]
        assert [record["labels"] for record in records] == [["two", "zero"], ["one", "two"]]
    else:
        assert all("logits" not in record and "labels" not in record for record in records)
    assert "Wrote the top 2 labels of 2 texts to" in capsys.readouterr().out


def test_predicting_more_labels_than_the_model_has_is_refused(tmp_path, monkeypatch):
    (tmp_path / "texts.txt").write_text("first\n")
    model = types.SimpleNamespace(label_names=None, config=types.SimpleNamespace(label_count=3))
    monkeypatch.setattr(commands, "load_trained", lambda args: (model, "tokenizer"))
    args = types.SimpleNamespace(input=str(tmp_path / "texts.txt"), k=4, output=str(tmp_path / "out.jsonl"))
    with pytest.raises(UsageError, match="argument -k: 4 exceeds the 3 labels of the model"):
        commands.command_predict(args)
    assert not (tmp_path / "out.jsonl").exists()
