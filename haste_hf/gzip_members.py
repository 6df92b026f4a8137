# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Gzip files of indexed members: JSON lines read on every core, and a rank's share without the lines before it.

A gzip file may be a concatenation of members (RFC 1952), and every gzip reader reads it as one stream. A member
written by `indexed_member` carries in its header an extra subfield `HX` (RFC 1952's FEXTRA, which readers skip)
with its own compressed size and the records (non-blank JSON lines) its text holds. The members of a file made of
such members are found by reading their headers alone (about 30,000 of them for 10^9 label texts of 60 bytes, in
members of 32,768 lines), so the file's record count is known before any is read, and the members are decompressed
and parsed by pyarrow in threads (zlib and pyarrow release the GIL): a 10^9-line label file, 58 GB of text, is one
pass of ~5 s on 64 cores, where one stream inflates and parses it in minutes; a rank keeps the records of its share
only.

Nothing in a header is trusted: every member is decompressed (its CRC checked) and parsed, and its records counted
against its header's; a file that is not made of such members, a member that does not hold what its header says or
that pyarrow cannot parse gives None, and the caller reads the file as one stream (the exact reader names the line
at fault). `benchmarks/scale_data.py` writes its files so.
"""

import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np


SUBFIELD = b"HX"
_EXTRA = struct.Struct("<2sHQQ")  # subfield id, its length (16), the member's compressed size, its records
_FIXED = struct.Struct("<4sIBBH")  # magic, method and flags; mtime; extra flags; OS; the extra field's length
_START = b"\x1f\x8b\x08\x04"  # gzip magic, deflate, FEXTRA alone
_TRAILER = 8  # CRC-32 and ISIZE


def indexed_member(text: bytes, records: int, level: int = 1) -> bytes:
    """One gzip member of `text` (`records` non-blank lines) whose header carries its size and record count."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    body = compressor.compress(text) + compressor.flush()
    size = _FIXED.size + _EXTRA.size + len(body) + _TRAILER
    header = _FIXED.pack(_START, 0, 0, 255, _EXTRA.size) + _EXTRA.pack(SUBFIELD, 16, size, records)
    return header + body + struct.pack("<II", zlib.crc32(text), len(text) & 0xFFFFFFFF)


def member_index(path: str | os.PathLike) -> np.ndarray | None:
    """int64 `[M, 3]`: the offset, compressed size and claimed records of each member of `path`, or None where it is
    not a gzip file made of `indexed_member`s only (then it is read as one stream)."""
    path = Path(path)
    if path.suffix != ".gz" or not path.is_file():
        return None
    rows = []
    with open(path, "rb") as handle:
        end, offset = os.fstat(handle.fileno()).st_size, 0
        while offset < end:
            handle.seek(offset)
            header = handle.read(_FIXED.size + _EXTRA.size)
            if len(header) < _FIXED.size + _EXTRA.size:
                return None
            start, _, _, _, extra_length = _FIXED.unpack_from(header)
            subfield, length, size, records = _EXTRA.unpack_from(header, _FIXED.size)
            if (start, extra_length, subfield, length) != (_START, _EXTRA.size, SUBFIELD, 16):
                return None
            if size < _FIXED.size + _EXTRA.size + _TRAILER or offset + size > end:
                return None
            rows.append((offset, size, records))
            offset += size
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3) if rows else None


class _NotAsClaimed(Exception):
    """A member that does not decompress, parse or count as its header says."""


def read_json_members(path: str | os.PathLike, schema, share=None):
    """`(records, table, start)` of a file of indexed members: its record count, and the pyarrow table (of the fields
    of `schema`, others skipped) of the records of ids `[start, stop)` (`share(records)`, None: all), every member
    parsed in threads and counted against its header; None where the file is not made of indexed members or one is
    not as its header says (`member_index`)."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    parse_options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")

    index = member_index(path)
    if index is None:
        return None
    claimed = index[:, 2]
    firsts = np.concatenate([[0], np.cumsum(claimed)])
    records = int(firsts[-1])
    start, stop = (0, records) if share is None or share(records) is None else share(records)
    descriptor = os.open(path, os.O_RDONLY)

    def parse(member: int):
        offset, size, count = (int(value) for value in index[member])
        inflater = zlib.decompressobj(31)
        try:
            text = inflater.decompress(os.pread(descriptor, size, offset))
        except zlib.error:
            raise _NotAsClaimed from None
        if not inflater.eof or inflater.unused_data:
            raise _NotAsClaimed
        if not text.strip():
            table = None
        else:
            options = pa_json.ReadOptions(use_threads=False, block_size=max(len(text), 1 << 20))
            try:
                table = pa_json.read_json(pa.BufferReader(text), read_options=options, parse_options=parse_options)
            except (pa.ArrowException, OverflowError):
                raise _NotAsClaimed from None
        if (0 if table is None else table.num_rows) != count:
            raise _NotAsClaimed
        low, high = max(start, int(firsts[member])), min(stop, int(firsts[member + 1]))
        return table.slice(low - int(firsts[member]), high - low) if low < high else None

    pool = ThreadPoolExecutor(len(os.sched_getaffinity(0)))
    try:
        tables = [table for table in pool.map(parse, range(len(index))) if table is not None]
    except _NotAsClaimed:
        return None
    finally:
        pool.shutdown(cancel_futures=True)  # the members not yet parsed, where one was not as claimed
        os.close(descriptor)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return records, table, start


def read_json_title_share(path: str | os.PathLike, share):
    """The `title`s of the share `share(records)` of a file of indexed members, in a `LabelNameTable` of all the
    records (`xmc_files.read_json_label_texts`); None where the file is not one, a title is missing or not a string,
    or the share is None (all the texts: `read_json_label_texts` reads them, the members in threads too)."""
    import pyarrow as pa

    from .modeling.label_names import LabelNameTable

    members = read_json_members(path, pa.schema([("title", pa.string())]), share)
    if members is None or members[1].column(0).null_count:
        return None
    records, table, start = members
    if share(records) is None:
        return None
    return LabelNameTable.from_arrow(table.column(0), source=str(path), first_label=start, label_count=records)
