"""`haste_hf.cli.parser.parse_args` as the `haste-hf` entry point calls it: without arguments it reads the command
line after the program's name."""

import sys

from haste_hf.cli.parser import parse_args


def test_without_arguments_the_command_line_after_the_programs_name_is_parsed(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["haste-hf", "push", "--model", str(tmp_path), "--repo-id", "me/model"])
    args = parse_args()
    assert (args.command, args.model, args.repo_id) == ("push", str(tmp_path), "me/model")
