"""Gzip files of indexed members (`haste_hf.gzip_members`, issue 42: 10^9 label texts read by one stream took minutes
in every command): the members are parsed in threads and a share keeps its records alone, with the same results as
the file read as one stream; a file whose members are not as their headers say is read as one stream, which still
names the line at fault."""

import gzip
import json
import zlib

import pytest

from haste_hf import gzip_members
from haste_hf.data import load_xmc_dataset
from haste_hf.gzip_members import indexed_member, member_index, read_json_members
from haste_hf.modeling.label_names import LabelNameTable
from haste_hf.xmc_files import XMCFormatError, read_json_label_texts, read_json_split


NAMES = [f'label {i} é \\ "q"' if i % 7 else "" for i in range(53)]
POINTS = [
    {"uid": f"p{i}", "title": f"text {i}", "content": "c" * (i % 3), "target_ind": sorted({i % 53, (5 * i) % 53})}
    for i in range(40)
]


def lines_of(records):
    return [json.dumps(record, ensure_ascii=i % 2 == 0) + "\n" for i, record in enumerate(records)]


def write_members(path, lines, per_member, records_of=len):
    """`lines` in indexed members of `per_member` lines (`records_of(chunk)`: the records a header claims)."""
    chunks = [lines[start : start + per_member] for start in range(0, len(lines), per_member)]
    path.write_bytes(b"".join(indexed_member("".join(c).encode(), records_of(c)) for c in chunks))
    return path


def write_dataset(folder, indexed: bool, per_member=6):
    """The same dataset as indexed members or as one plain gzip stream."""
    folder.mkdir()
    label_lines = lines_of({"uid": f"l{i}", "title": name} for i, name in enumerate(NAMES))
    point_lines = lines_of(POINTS)
    for name, lines in (("lbl.json.gz", label_lines), ("trn.json.gz", point_lines), ("tst.json.gz", point_lines[:9])):
        if indexed:
            write_members(folder / name, lines, per_member)
        else:
            (folder / name).write_bytes(gzip.compress("".join(lines).encode()))
    return folder


def refuse(*args, **kwargs):
    raise AssertionError("the file was read as one stream")


def test_indexed_members_are_one_gzip_stream_and_their_headers_index_them(tmp_path):
    lines = lines_of({"uid": f"l{i}", "title": name} for i, name in enumerate(NAMES))
    path = write_members(tmp_path / "lbl.json.gz", lines, 10)
    assert gzip.decompress(path.read_bytes()).decode() == "".join(lines)  # any gzip reader reads the file whole
    index = member_index(path)
    assert index.shape == (6, 3) and index[:, 2].tolist() == [10] * 5 + [3]
    assert index[0, 0] == 0 and (index[1:, 0] == index[:-1, 0] + index[:-1, 1]).all()
    assert index[-1, 0] + index[-1, 1] == path.stat().st_size
    plain = tmp_path / "plain.json.gz"
    plain.write_bytes(gzip.compress(b"".join(line.encode() for line in lines)))
    appended = tmp_path / "appended.json.gz"  # indexed members, then one that is not: not an index
    appended.write_bytes(path.read_bytes() + plain.read_bytes())
    assert member_index(plain) is None and member_index(appended) is None
    assert member_index(tmp_path / "missing.json.gz") is None


def test_indexed_members_read_as_the_plain_stream_in_every_reader(tmp_path, monkeypatch):
    plain = write_dataset(tmp_path / "plain", indexed=False)
    indexed = write_dataset(tmp_path / "indexed", indexed=True)
    expected = {
        "texts": read_json_label_texts(plain / "lbl.json.gz"),
        "train": read_json_split(plain / "trn.json.gz", len(NAMES), text_fields="title_content").dataset.to_list(),
        "shares": [
            read_json_label_texts(plain / "lbl.json.gz", lambda count, r=r: (count * r // 4, count * (r + 1) // 4))
            for r in range(4)
        ],
        "frequencies": load_xmc_dataset(plain, cache_dir=tmp_path / "cache").train_label_frequencies,
    }
    import pyarrow

    monkeypatch.setattr(pyarrow, "input_stream", refuse)  # how the file is read as one stream (`xmc_files`)
    assert read_json_label_texts(indexed / "lbl.json.gz") == expected["texts"] == NAMES
    train = read_json_split(indexed / "trn.json.gz", len(NAMES), text_fields="title_content").dataset
    assert train.to_list() == expected["train"]
    for rank, share in enumerate(expected["shares"]):
        ours = read_json_label_texts(
            indexed / "lbl.json.gz", lambda count, r=rank: (count * r // 4, count * (r + 1) // 4)
        )
        assert isinstance(ours, LabelNameTable) and ours.held == share.held and len(ours) == len(NAMES)
        assert [ours[i] for i in range(*ours.held)] == NAMES[slice(*share.held)]
    empty = load_xmc_dataset(indexed, cache_dir=tmp_path / "cache", label_text_share=lambda count: (0, 0))
    assert empty.label_count == len(NAMES) and empty.label_texts.held == (0, 0)
    assert (empty.train_label_frequencies == expected["frequencies"]).all()


def test_members_are_parsed_in_threads(tmp_path, monkeypatch):
    """Every member is parsed on a thread of the pool (zlib and pyarrow release the GIL), not by the caller."""
    import threading

    path = write_members(tmp_path / "lbl.json.gz", lines_of({"title": str(i)} for i in range(40)), 5)
    threads = set()
    inflate = zlib.decompressobj

    def recorded(*args):
        threads.add(threading.get_ident())
        return inflate(*args)

    monkeypatch.setattr(gzip_members.zlib, "decompressobj", recorded)
    import pyarrow as pa

    records, table, start = read_json_members(path, pa.schema([("title", pa.string())]), lambda count: (7, 31))
    assert (records, start, table.column(0).to_pylist()) == (40, 7, [str(i) for i in range(7, 31)])
    assert threads and threading.get_ident() not in threads


@pytest.mark.parametrize("fault", ["claims a record too many", "a blank line", "a malformed line", "damaged bytes"])
def test_members_not_as_their_headers_say_are_read_as_one_stream(tmp_path, fault):
    """The headers are not trusted: a wrong claim, or a member that does not parse or decompress, sends the file to
    the one-stream reader, which counts the records itself or names the line at fault."""
    lines = lines_of({"uid": f"l{i}", "title": name} for i, name in enumerate(NAMES))
    path = tmp_path / "lbl.json.gz"
    if fault == "claims a record too many":
        write_members(path, lines, 8, lambda chunk: len(chunk) + (chunk is not None and chunk[0] == lines[16]))
    elif fault == "a blank line":  # pyarrow skips it: a header claiming it as a record is wrong
        write_members(path, [*lines[:20], "\n", *lines[20:]], 8)
    elif fault == "a malformed line":
        write_members(path, [*lines[:20], '{"uid": "x", "title": 3}\n', *lines[20:]], 8)
    else:
        write_members(path, lines, 8)  # the trailing CRC of the last member no longer matches
        data = bytearray(path.read_bytes())
        data[-6] ^= 0xFF
        path.write_bytes(bytes(data))
    import pyarrow as pa

    assert read_json_members(path, pa.schema([("title", pa.string())])) is None
    share = lambda count: (0, count // 2)  # noqa: E731
    if fault in ("claims a record too many", "a blank line"):
        texts = read_json_label_texts(path, share)
        assert len(texts) == len(NAMES) and [texts[i] for i in range(*texts.held)] == NAMES[: len(NAMES) // 2]
    elif fault == "a malformed line":
        with pytest.raises(XMCFormatError, match=r"lbl.json.gz, line 21: missing or non-string `title`"):
            read_json_label_texts(path, share)
    else:
        with pytest.raises((OSError, EOFError, zlib.error)):
            read_json_label_texts(path, share)
