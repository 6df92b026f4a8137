# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Reading the label texts of millions of labels (issue 28): pyarrow's JSON reader, the same texts as the
line-by-line reader, which still names the line at fault."""

import gzip
import json

import pytest

from haste_hf import xmc_files
from haste_hf.data import XMCFormatError, read_json_label_texts


TITLES = ["plain", 'quote " and \\ backslash', "line\nbreak\ttab", "ünïcødé ✓ 漢字", "", "  spaces  ", "x" * 5000]


def write_labels(path, lines):
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("name", ["lbl.json", "lbl.json.gz"])
def test_label_texts_are_read_without_a_json_parse_per_line(tmp_path, monkeypatch, name):
    lines = [
        json.dumps({"uid": f"u{i}", "title": title, "extra": [i]}, ensure_ascii=i % 2 == 0)
        for i, title in enumerate(TITLES)
    ]
    lines.insert(3, "")  # blank lines are not labels
    path = write_labels(tmp_path / name, lines)
    expected = read_json_label_texts(path)
    assert expected == TITLES

    def refuse(*args, **kwargs):
        raise AssertionError("json.loads called per line")

    monkeypatch.setattr(xmc_files.json, "loads", refuse)
    assert read_json_label_texts(path) == TITLES


@pytest.mark.parametrize(
    "odd_line",
    [
        json.dumps({"uid": "long", "title": "long", "content": "y" * (2 << 20)}),  # past pyarrow's 1 MB block
        '{"uid": "s", "title": "lone \\ud800 surrogate"}',  # valid JSON that pyarrow's UTF-8 check refuses
    ],
    ids=["a line past pyarrow's block", "a lone surrogate escape"],
)
def test_label_texts_pyarrow_cannot_read_are_read_line_by_line(tmp_path, odd_line):
    """Valid JSON lines that pyarrow's reader refuses: the line-by-line reader gives every title, in id order."""
    lines = [json.dumps({"uid": f"u{i}", "title": title}) for i, title in enumerate(TITLES)]
    path = write_labels(tmp_path / "lbl.json.gz", [*lines[:2], odd_line, *lines[2:]])
    assert xmc_files._fast_json_label_texts(path) is None
    assert read_json_label_texts(path) == [*TITLES[:2], json.loads(odd_line)["title"], *TITLES[2:]]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"uid": "c"}', "missing or non-string `title`"),
        ('{"uid": "c", "title": 7}', "missing or non-string `title`"),
        ('{"uid": "c", "title": null}', "missing or non-string `title`"),
        ('{"uid": "c", "title": "x"', "invalid JSON"),
        ('["c", "x"]', "expected a JSON object"),
    ],
)
def test_a_bad_label_line_is_still_named(tmp_path, line, message):
    path = write_labels(tmp_path / "lbl.json.gz", ['{"uid": "a", "title": "a"}', '{"uid": "b", "title": "b"}', line])
    with pytest.raises(XMCFormatError, match=f"line 3: {message}"):
        read_json_label_texts(path)
