"""Readers of the Extreme Classification Repository's files, one file at a time (the layouts they make up, and the
folder as a whole: `data.load_xmc_dataset`).

Every reader returns `datasets` objects with a `labels` column (`List(Value("int32"))`, 0-based label ids)
and, for raw-text formats, a `text` column. Files are read line by line and written to Arrow by
`Dataset.from_generator`, so a large file never sits in memory as Python objects (only label texts do); a JSON-lines
split pyarrow reads and the checks pass is read by pyarrow into an in-memory Arrow table instead (`_fast_json_split`).
Malformed input raises `XMCFormatError` (a `ValueError`) naming the file and the 1-based line.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from datasets import Dataset, Features, List, NamedSplit, Value
from datasets.exceptions import DatasetGenerationError

from .modeling.label_names import LabelNameTable


if TYPE_CHECKING:
    import scipy.sparse


TEXT_FEATURES = Features({"text": Value("string"), "labels": List(Value("int32"))})
LABEL_FEATURES = Features({"labels": List(Value("int32"))})

TextFields = Literal["title", "title_content"]
# Bumped whenever a reader's output for the same file changes, so stale Arrow caches are not reused.
_READER_VERSION = "2"  # 2: a file of no points is refused (1 cached an empty split)


class XMCFormatError(ValueError):
    """A data file does not follow its format; the message names the file and the 1-based line (None: the
    whole file)."""

    def __init__(self, path: str | Path, line_number: int | None, message: str):
        super().__init__(f"{path}, line {line_number}: {message}" if line_number is not None else f"{path}: {message}")
        self.path = str(path)
        self.line_number = line_number


@dataclass
class XMCSplit:
    """One split read from disk: its dataset, the label count the file declares, and optional BoW features."""

    dataset: Dataset
    label_count: int
    features: scipy.sparse.csr_matrix | None = None


# ----------------------------------------------------------------------------------------------------------
# Line-level parsing


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """Yields `(1-based line number, line without its end of line)`; `.gz` files are decompressed.

    Lines are split on `\\n` only (a stray `\\r` inside a text must not split it) and decoded one at a time so a
    decoding error can name its line.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            try:
                yield line_number, raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise XMCFormatError(path, line_number, f"not valid UTF-8 ({error.reason})") from None


def _parse_header(path: Path, lines: Iterator[tuple[int, str]], names: tuple[str, ...]) -> tuple[int, ...]:
    expected = " ".join(names)
    try:
        _, line = next(lines)
    except StopIteration:
        raise XMCFormatError(path, 1, f"empty file, expected a header `{expected}`") from None
    tokens = line.split()
    if len(tokens) != len(names) or not all(token.isdigit() for token in tokens):
        raise XMCFormatError(path, 1, f"bad header {line!r}, expected {len(names)} non-negative integers `{expected}`")
    return tuple(int(token) for token in tokens)


def _parse_label_ids(path: Path, line_number: int, tokens: list[str], label_count: int) -> list[int]:
    try:
        labels = [int(token) for token in tokens]
    except ValueError:
        raise XMCFormatError(path, line_number, f"label ids must be integers, got {tokens!r}") from None
    _check_label_ids(path, line_number, labels, label_count)
    return labels


def _check_label_ids(path: Path, line_number: int, labels: list[int], label_count: int) -> None:
    for label in labels:
        if not 0 <= label < label_count:
            raise XMCFormatError(path, line_number, f"label id {label} is outside [0, {label_count})")
    if len(set(labels)) != len(labels):
        raise XMCFormatError(path, line_number, f"duplicate label ids in {labels}")


def _parse_sparse_pairs(path: Path, line_number: int, tokens: list[str], size: int, what: str):
    """Parses `i:v` tokens into (indices, values), checking `0 <= i < size`."""
    indices, values = [], []
    for token in tokens:
        index, sep, value = token.partition(":")
        try:
            if not sep:
                raise ValueError
            indices.append(int(index))
            values.append(float(value))
        except ValueError:
            raise XMCFormatError(path, line_number, f"expected `{what}:value`, got {token!r}") from None
        if not 0 <= indices[-1] < size:
            raise XMCFormatError(path, line_number, f"{what} {indices[-1]} is outside [0, {size})")
    return indices, values


def _no_points(path: Path, what: str) -> XMCFormatError:
    return XMCFormatError(path, None, f"the file holds no points ({what}); a split needs at least one")


def _check_row_count(path: Path, rows_seen: int, num_rows: int) -> None:
    if num_rows == 0:
        raise _no_points(path, "its header announces 0 rows")
    if rows_seen != num_rows:
        # Rows start on line 2, after the header.
        raise XMCFormatError(
            path, rows_seen + 2, f"the header announces {num_rows} rows but the file has {rows_seen} rows"
        )


def _too_many_rows(path: Path, line_number: int, num_rows: int) -> XMCFormatError:
    return XMCFormatError(path, line_number, f"more rows than the {num_rows} announced in the header")


def _split_bow_line(line: str) -> tuple[list[str], list[str]]:
    """Splits a bag-of-words line into (label tokens, feature tokens)."""
    tokens = line.split()
    # A line with no labels starts with a space; tolerate files that drop it and start with a feature.
    if line[:1].isspace() or not tokens or ":" in tokens[0]:
        return [], tokens
    return tokens[0].split(","), tokens[1:]


# ----------------------------------------------------------------------------------------------------------
# Row generators (module level, so `Dataset.from_generator` can run and cache them)


def _json_rows(path: str, label_count: int, text_fields: TextFields) -> Iterator[dict[str, Any]]:
    path = Path(path)
    points = 0
    for line_number, line in _iter_lines(path):
        if not line.strip():
            continue
        record = _parse_json_record(path, line_number, line)
        title = record.get("title")
        if not isinstance(title, str):
            raise XMCFormatError(path, line_number, "missing or non-string `title`")
        text = title
        if text_fields == "title_content":
            content = record.get("content")
            if not isinstance(content, str):
                raise XMCFormatError(path, line_number, "missing or non-string `content` (text_fields='title_content')")
            text = f"{title} {content}" if content else title
        labels = record.get("target_ind")
        if not isinstance(labels, list) or not all(
            isinstance(label, int) and not isinstance(label, bool) for label in labels
        ):
            raise XMCFormatError(path, line_number, "`target_ind` must be a list of integer label ids")
        _check_label_ids(path, line_number, labels, label_count)
        points += 1
        yield {"text": text, "labels": labels}
    if not points:
        raise _no_points(path, "no JSON line")


def _parse_json_record(path: Path, line_number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise XMCFormatError(path, line_number, f"invalid JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise XMCFormatError(path, line_number, "expected a JSON object")
    return record


def _sparse_label_rows(labels_path: str) -> Iterator[tuple[int, list[int]]]:
    """Yields `(line number, label ids)` of a `N L` sparse label file; values are parsed but not used."""
    path = Path(labels_path)
    lines = _iter_lines(path)
    num_rows, label_count = _parse_header(path, lines, ("N", "L"))
    rows_seen = 0
    for line_number, line in lines:
        if rows_seen == num_rows:
            raise _too_many_rows(path, line_number, num_rows)
        labels, _ = _parse_sparse_pairs(path, line_number, line.split(), label_count, "label id")
        _check_label_ids(path, line_number, labels, label_count)
        rows_seen += 1
        yield line_number, labels
    _check_row_count(path, rows_seen, num_rows)


def _text_sparse_rows(texts_path: str, labels_path: str) -> Iterator[dict[str, Any]]:
    texts = _iter_lines(Path(texts_path))
    for _, labels in _sparse_label_rows(labels_path):
        try:
            _, text = next(texts)
        except StopIteration:
            raise XMCFormatError(
                texts_path, _line_count(Path(texts_path)) + 1, f"fewer texts than label rows in {labels_path}"
            ) from None
        yield {"text": text, "labels": labels}
    for line_number, _ in texts:
        raise XMCFormatError(texts_path, line_number, f"more texts than label rows in {labels_path}")


def _line_count(path: Path) -> int:
    return sum(1 for _ in _iter_lines(path))


def _sparse_label_only_rows(labels_path: str) -> Iterator[dict[str, Any]]:
    for _, labels in _sparse_label_rows(labels_path):
        yield {"labels": labels}


def _bow_rows(path: str) -> Iterator[dict[str, Any]]:
    path = Path(path)
    lines = _iter_lines(path)
    num_rows, _, label_count = _parse_header(path, lines, ("N", "D", "L"))
    rows_seen = 0
    for line_number, line in lines:
        if rows_seen == num_rows:
            raise _too_many_rows(path, line_number, num_rows)
        label_tokens, _ = _split_bow_line(line)
        rows_seen += 1
        yield {"labels": _parse_label_ids(path, line_number, label_tokens, label_count)}
    _check_row_count(path, rows_seen, num_rows)


# ----------------------------------------------------------------------------------------------------------
# Dataset construction


def _fingerprint(generator_name: str, sources: list[Path], options: dict[str, Any]) -> str:
    """Cache key of a generated dataset: reader, options and each source file's path, size and mtime."""
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in sources]
    payload = json.dumps([_READER_VERSION, generator_name, stats, options], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _generate(generator, gen_kwargs: dict[str, Any], features: Features, split: str, cache_dir) -> Dataset:
    sources = [Path(value) for key, value in gen_kwargs.items() if key.endswith("path")]
    for source in sources:
        if not source.is_file():
            raise FileNotFoundError(f"{source} does not exist")
    options = {key: value for key, value in gen_kwargs.items() if not key.endswith("path")}
    try:
        return Dataset.from_generator(
            generator,
            features=features,
            gen_kwargs=gen_kwargs,
            cache_dir=None if cache_dir is None else str(cache_dir),
            split=NamedSplit(split),
            fingerprint=_fingerprint(generator.__name__, sources, {**options, "split": split}),
        )
    except DatasetGenerationError as error:
        # `datasets` wraps errors raised inside the generator; surface ours unchanged.
        if isinstance(error.__cause__, XMCFormatError):
            raise error.__cause__ from None
        raise


# A share of the label texts (`read_json_label_texts`, `read_label_texts`): of the label count, the `[start, stop)` of
# the ids whose texts a process keeps (a rank's share of a label-sharded run), or None for all of them.
LabelTextShare = Callable[[int], "tuple[int, int] | None"]


def read_json_label_texts(path: str | Path, share: LabelTextShare | None = None) -> list[str] | LabelNameTable:
    """Reads label texts (`title`) from an `lbl.json[.gz]` file, one label per non-blank line, in id order (from
    `COMPACT_LABEL_TEXTS_FROM` labels as a compact, read-only `LabelNameTable`).

    pyarrow's JSON reader parses the file on all cores (8.6M labels: seconds, where a `json.loads` per line takes
    tens of seconds, in every command that reads the data); a file it cannot read into one string column is read
    again line by line, which names the line at fault.

    `share`: where it gives a range of the label count, the file is streamed twice (to count the labels, then to the
    range's end) and only the range's texts are kept, in a `LabelNameTable` of every label that holds those (at 10^9
    labels a rank of four holds a quarter of the ~34 GB of texts, not all of them).
    """
    path = Path(path)
    if share is not None:
        count = _streamed_json_titles(path)
        window = None if count is None else share(count)
        if window is not None:
            start, stop = window
            kept = []
            if start < stop:
                _streamed_json_titles(
                    path, lambda first, titles: kept.append(_overlap(titles, first, start, stop)), stop
                )
            import pyarrow as pa

            titles = pa.chunked_array([chunk for chunk in kept if chunk is not None], type=pa.string())
            return LabelNameTable.from_arrow(titles, source=str(path), first_label=start, label_count=count)
    texts = _fast_json_label_texts(path)
    if texts is not None:
        return texts
    texts = []
    for line_number, line in _iter_lines(path):
        if not line.strip():
            continue
        title = _parse_json_record(path, line_number, line).get("title")
        if not isinstance(title, str):
            raise XMCFormatError(path, line_number, "missing or non-string `title`")
        texts.append(title)
    return texts


def _read_json_columns(path: Path, columns: dict):
    """The fields `columns` (name: pyarrow type) of the JSON lines of `path` as a pyarrow table, every other field
    skipped as it is parsed (8.6M label uids, 2M contents read for a title-only run: gigabytes held for nothing);
    None where pyarrow cannot read them as these types. A line that lacks a field gives a null, which the callers
    refuse."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    options = pa_json.ParseOptions(explicit_schema=pa.schema(list(columns.items())), unexpected_field_behavior="ignore")
    try:
        with pa.input_stream(str(path), compression="gzip" if path.suffix == ".gz" else None) as stream:
            return pa_json.read_json(stream, parse_options=options)
    except (pa.ArrowException, OSError):
        return None


# From this many labels, `read_json_label_texts` reads the texts into a compact `LabelNameTable` (one offsets vector,
# one byte buffer), not a list of strings: 10^9 of them would be about 80 GB of Python objects in every process. Above
# the largest label set measured as lists (8.6M labels, `benchmarks/scale_data.py`), which keep their path.
COMPACT_LABEL_TEXTS_FROM = 20_000_000


def _fast_json_label_texts(path: Path) -> list[str] | None:
    """The `title` of every line of `path` by pyarrow, or None where it reads no string column without a gap
    (malformed lines, missing or non-string titles, bad UTF-8): the exact reader then says what is wrong."""
    import pyarrow as pa

    table = _read_json_columns(path, {"title": pa.string()})
    if table is None or "title" not in table.column_names:
        return None
    titles = table.column("title")
    if not pa.types.is_string(titles.type) or titles.null_count:
        return None
    if len(titles) >= COMPACT_LABEL_TEXTS_FROM:
        return LabelNameTable.from_arrow(titles, source=str(path))
    return titles.to_pylist()


def _streamed_json_titles(path: Path, batch=None, stop: int | None = None) -> int | None:
    """Streams the `title`s of `path` (pyarrow, one block at a time): `batch(first id, titles)` of each block up to
    the one holding id `stop - 1`; the titles read, or None where pyarrow reads no string column without a gap (the
    exact reader then says what is wrong)."""
    import pyarrow as pa
    import pyarrow.json as pa_json

    options = pa_json.ParseOptions(
        explicit_schema=pa.schema([("title", pa.string())]), unexpected_field_behavior="ignore"
    )
    count = 0
    try:
        with pa.input_stream(str(path), compression="gzip" if path.suffix == ".gz" else None) as stream:
            for block in pa_json.open_json(stream, parse_options=options):
                titles = block.column(0)
                if titles.null_count:
                    return None
                if batch is not None:
                    batch(count, titles)
                count += len(titles)
                if stop is not None and count >= stop:
                    break
    except (pa.ArrowException, OSError):
        return None
    return count


def _overlap(texts, first: int, start: int, stop: int):
    """The part of `texts` (of ids from `first`) with ids in `[start, stop)`, or None."""
    low, high = max(start, first), min(stop, first + len(texts))
    return texts[low - first : high - first] if low < high else None


def read_label_texts(path: str | Path, share: LabelTextShare | None = None) -> list[str] | LabelNameTable:
    """Reads `Y.txt`: one label text per line, in id order; `share` as `read_json_label_texts` takes it (the lines
    counted first)."""
    path = Path(path)
    if share is not None:
        count = _line_count(path)
        window = share(count)
        if window is not None:
            start, stop = window
            kept = []
            for line_number, line in _iter_lines(path):
                if line_number > stop:
                    break
                if line_number > start:
                    kept.append(line)
            table = LabelNameTable.from_strings(kept)
            return LabelNameTable(table.pieces, str(path), first_label=start, label_count=count)
    return [line for _, line in _iter_lines(path)]


def read_json_split(
    path: str | Path,
    label_count: int,
    *,
    text_fields: TextFields = "title",
    split: str = "train",
    cache_dir: str | Path | None = None,
) -> XMCSplit:
    """Reads a `trn.json[.gz]`-style file: one JSON object per line with `title`, `content`, `target_ind`.

    Args:
        label_count: size of the label space (the number of lines of `lbl.json.gz`); ids must be below it.
        text_fields: `"title"` uses the title only (title datasets); `"title_content"` uses
            `title + " " + content` (full-text datasets). Nothing is truncated here: the tokenizer does it.
    """
    if text_fields not in ("title", "title_content"):
        raise ValueError(f"text_fields must be 'title' or 'title_content', got {text_fields!r}")
    gen_kwargs = {"path": str(path), "label_count": label_count, "text_fields": text_fields}
    fingerprint = _fingerprint("json_arrow", [Path(path)], {"label_count": label_count, "text_fields": text_fields})
    fast = _fast_json_split(Path(path), label_count, text_fields, NamedSplit(split), fingerprint)
    if fast is not None:
        return XMCSplit(fast, label_count)
    return XMCSplit(_generate(_json_rows, gen_kwargs, TEXT_FEATURES, split, cache_dir), label_count)


def _fast_json_split(path: Path, label_count: int, text_fields: TextFields, split, fingerprint: str) -> Dataset | None:
    """The split of a JSON-lines file read by pyarrow on all cores into an in-memory Arrow table (2M points:
    seconds, where a `json.loads` per line and `from_generator` take most of a minute), checked as `_json_rows`
    checks it, vectorised; None where a check fails or pyarrow cannot read the file: the line-by-line reader then
    names the line at fault."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from datasets import DatasetInfo
    from datasets.table import InMemoryTable

    fields = ("title", "target_ind", "content") if text_fields == "title_content" else ("title", "target_ind")
    table = _read_json_columns(
        path, {name: pa.list_(pa.int64()) if name == "target_ind" else pa.string() for name in fields}
    )
    if table is None:
        return None
    table = table.combine_chunks()
    if not table.num_rows or any(name not in table.column_names for name in fields):
        return None
    text, labels = table.column("title"), table.column("target_ind")
    strings = [text] + ([table.column("content")] if text_fields == "title_content" else [])
    if any(not pa.types.is_string(column.type) or column.null_count for column in strings):
        return None
    try:
        for column in strings:
            column.validate(full=True)  # UTF-8: pyarrow reads bad bytes into a string column unchecked
    except pa.ArrowInvalid:
        return None
    if labels.null_count or not (pa.types.is_list(labels.type) and pa.types.is_integer(labels.type.value_type)):
        return None
    if text_fields == "title_content":
        content = strings[1]
        text = pc.if_else(pc.equal(pc.utf8_length(content), 0), text, pc.binary_join_element_wise(text, content, " "))
    labels = labels.chunk(0) if labels.num_chunks else pa.array([], labels.type)
    ids = np.asarray(labels.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    lengths = pc.list_value_length(labels).to_numpy(zero_copy_only=False).astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= label_count):
        return None
    if _lists_a_label_twice(ids, lengths):
        return None
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    columns = {"text": text, "labels": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.astype(np.int32)))}
    arrow = pa.table(columns).cast(TEXT_FEATURES.arrow_schema)
    info = DatasetInfo(features=TEXT_FEATURES)
    return Dataset(InMemoryTable(arrow), info=info, split=split, fingerprint=fingerprint)


def _lists_a_label_twice(ids: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether a point lists a label twice (`ids`: every point's ids in turn, `lengths`: how many each). Where every
    point lists its ids in increasing order, as the repository's files do, one pass says no; else a sort of (point,
    id) pairs decides (a lexsort of 110M positives took tens of seconds)."""
    ends = np.cumsum(lengths)
    increasing = np.diff(ids) > 0
    increasing[ends[(ends > 0) & (ends < ids.size)] - 1] = True  # a point's last id against the next one's first
    if increasing.all():
        return False
    rows = np.repeat(np.arange(lengths.size), lengths)
    order = np.lexsort((ids, rows))
    return bool(np.any((np.diff(rows[order]) == 0) & (np.diff(ids[order]) == 0)))


def read_text_split(
    texts_path: str | Path, labels_path: str | Path, *, split: str = "train", cache_dir: str | Path | None = None
) -> XMCSplit:
    """Reads `trn_X.txt` (one text per line) with `trn_X_Y.txt` (header `N L`, lines `l:v ...`).

    Every listed label is a positive; the values are checked to be numbers but otherwise ignored.
    """
    gen_kwargs = {"texts_path": str(texts_path), "labels_path": str(labels_path)}
    dataset = _generate(_text_sparse_rows, gen_kwargs, TEXT_FEATURES, split, cache_dir)
    return XMCSplit(dataset, _read_header(Path(labels_path), ("N", "L"))[1])


def read_sparse_label_split(
    labels_path: str | Path, *, split: str = "train", cache_dir: str | Path | None = None
) -> XMCSplit:
    """Reads a sparse label file (`trn_X_Y.txt`, header `N L`) into a labels-only dataset."""
    dataset = _generate(_sparse_label_only_rows, {"labels_path": str(labels_path)}, LABEL_FEATURES, split, cache_dir)
    return XMCSplit(dataset, _read_header(Path(labels_path), ("N", "L"))[1])


def read_bow_file(
    path: str | Path, *, return_features: bool = False, split: str = "train", cache_dir: str | Path | None = None
) -> XMCSplit:
    """Reads a single-file bag-of-words split (header `N D L`, lines `l1,l2 f:v f:v ...`).

    Labels always go into the dataset. Features are parsed (and validated) only with `return_features=True`,
    in a second pass, into a float32 CSR `[N, D]` matrix.
    """
    dataset = _generate(_bow_rows, {"path": str(path)}, LABEL_FEATURES, split, cache_dir)
    label_count = _read_header(Path(path), ("N", "D", "L"))[2]
    features = _read_features(Path(path), bow_labels=True) if return_features else None
    return XMCSplit(dataset, label_count, features)


def read_sparse_features(path: str | Path) -> scipy.sparse.csr_matrix:
    """Reads a bag-of-words feature file (`trn_X_Xf.txt`, header `N D`, lines `f:v ...`) into a CSR matrix."""
    return _read_features(Path(path), bow_labels=False)


def _read_header(path: Path, names: tuple[str, ...]) -> tuple[int, ...]:
    return _parse_header(path, _iter_lines(path), names)


def _read_features(path: Path, bow_labels: bool) -> scipy.sparse.csr_matrix:
    import scipy.sparse

    lines = _iter_lines(path)
    if bow_labels:
        num_rows, num_features, _ = _parse_header(path, lines, ("N", "D", "L"))
    else:
        num_rows, num_features = _parse_header(path, lines, ("N", "D"))
    # Typed arrays keep the memory at nnz * (8 + 4) bytes rather than one Python object per entry.
    indptr, indices, values = array("q", [0]), array("q"), array("f")
    for line_number, line in lines:
        if len(indptr) - 1 == num_rows:
            raise _too_many_rows(path, line_number, num_rows)
        tokens = _split_bow_line(line)[1] if bow_labels else line.split()
        row_indices, row_values = _parse_sparse_pairs(path, line_number, tokens, num_features, "feature index")
        indices.extend(row_indices)
        values.extend(row_values)
        indptr.append(len(indices))
    _check_row_count(path, len(indptr) - 1, num_rows)
    return scipy.sparse.csr_matrix(
        (np.frombuffer(values, np.float32), np.frombuffer(indices, np.int64), np.frombuffer(indptr, np.int64)),
        shape=(num_rows, num_features),
    )


def read_filter_file(path: str | Path, *, num_points: int | None = None, label_count: int | None = None) -> np.ndarray:
    """Reads `filter_labels_*.txt` (`doc_idx label_idx` per line) into an int64 `[M, 2]` array.

    Each pair is to be excluded from that point's predictions before taking the top k (see
    `haste_hf.metrics.filter_top_k`). Blank lines are skipped; indices are checked when the bounds are given.
    """
    path = Path(path)
    pairs = array("q")
    for line_number, line in _iter_lines(path):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != 2 or not all(token.isdigit() for token in tokens):
            raise XMCFormatError(
                path, line_number, f"expected `doc_idx label_idx` (two non-negative ints), got {line!r}"
            )
        doc, label = int(tokens[0]), int(tokens[1])
        if num_points is not None and doc >= num_points:
            raise XMCFormatError(path, line_number, f"doc_idx {doc} is outside [0, {num_points})")
        if label_count is not None and label >= label_count:
            raise XMCFormatError(path, line_number, f"label_idx {label} is outside [0, {label_count})")
        pairs.extend((doc, label))
    return np.frombuffer(pairs, np.int64).reshape(-1, 2).copy()
