import gzip
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from haste_hf.data import (
    LabelIdPadding,
    XMCDataCollator,
    XMCFormatError,
    demo_dataset_path,
    detect_format,
    label_frequencies,
    load_xmc_dataset,
    pad_label_ids,
    read_bow_file,
    read_filter_file,
    read_json_split,
    read_sparse_features,
    read_sparse_label_split,
    read_text_split,
)
from haste_hf.xmc_files import _json_rows


REAL_DEPS = Path("/work/shared/data/debian-xmc/deps/trn.json.gz")


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def json_lines(records) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "cache"


@pytest.fixture
def json_dir(tmp_path):
    data = tmp_path / "json_data"
    data.mkdir()
    write(data / "lbl.json.gz", json_lines([{"uid": f"u{i}", "title": f"label {i}"} for i in range(4)]))
    train = [
        {"uid": "a", "title": "alpha", "content": "first doc", "target_ind": [0, 2]},
        {"uid": "b", "title": "beta", "content": "", "target_ind": [0]},
        {"uid": "c", "title": "gamma", "content": "third", "target_ind": [3, 0, 1]},
    ]
    write(data / "trn.json.gz", json_lines(train))
    write(data / "tst.json", json_lines([{"uid": "d", "title": "delta", "content": "x", "target_ind": [1]}]) + "\n")
    write(data / "filter_labels_test.txt", "0 3\n0 2\n")
    return data


def test_json_dataset_title_and_content(json_dir, cache):
    dataset = load_xmc_dataset(json_dir, cache_dir=cache)
    assert dataset.format == "json"
    assert dataset.label_count == 4
    assert dataset.label_texts == ["label 0", "label 1", "label 2", "label 3"]
    assert dataset.splits["train"]["text"] == ["alpha", "beta", "gamma"]
    assert dataset.splits["train"]["labels"] == [[0, 2], [0], [3, 0, 1]]
    assert dataset.splits["test"]["labels"] == [[1]]  # plain .json, trailing blank line skipped
    assert dataset.splits["train"].features["labels"].feature.dtype == "int32"
    np.testing.assert_array_equal(dataset.train_label_frequencies, [3, 1, 1, 1])
    assert dataset.train_label_frequencies.dtype == np.int32
    np.testing.assert_array_equal(dataset.filters["test"], [[0, 3], [0, 2]])

    full = load_xmc_dataset(json_dir, text_fields="title_content", cache_dir=cache)
    assert full.splits["train"]["text"] == ["alpha first doc", "beta", "gamma third"]
    for other in ("content", "title content", None):
        with pytest.raises(ValueError, match=f"text_fields must be 'title' or 'title_content', got {other!r}"):
            read_json_split(json_dir / "trn.json.gz", 4, text_fields=other, cache_dir=cache)


def test_label_text_augmentation(json_dir, cache):
    dataset = load_xmc_dataset(json_dir, add_label_texts=True, cache_dir=cache)
    train = dataset.splits["train"]
    assert len(train) == 3 + 4
    assert train[3:] == {"text": ["label 0", "label 1", "label 2", "label 3"], "labels": [[0], [1], [2], [3]]}
    # Frequencies and N describe the training file, not the added label points.
    np.testing.assert_array_equal(dataset.train_label_frequencies, [3, 1, 1, 1])
    assert dataset.num_train_points == 3
    np.testing.assert_array_equal(label_frequencies(train, 4), [4, 2, 2, 2])


def test_changed_file_is_not_served_from_cache(tmp_path, cache):
    path = write(tmp_path / "trn.json", json_lines([{"title": "old", "target_ind": [0]}]))
    assert read_json_split(path, 2, cache_dir=cache).dataset["text"] == ["old"]
    write(path, json_lines([{"title": "newer", "target_ind": [1]}]))
    assert read_json_split(path, 2, cache_dir=cache).dataset["labels"] == [[1]]


def test_text_sparse_dataset(tmp_path, cache):
    write(tmp_path / "trn_X.txt", "first text\n\nthird\r\n")
    write(tmp_path / "trn_X_Y.txt", "3 5\n0:1 4:1\n\n2:1.0\n")
    write(tmp_path / "tst_X.txt", "test text\n")
    write(tmp_path / "tst_X_Y.txt", "1 5\n3:1\n")
    write(tmp_path / "Y.txt", "zero\none\ntwo\nthree\nfour\n")
    assert detect_format(tmp_path) == "text_sparse"
    dataset = load_xmc_dataset(tmp_path, add_label_texts=True, cache_dir=cache)
    assert dataset.label_count == 5
    assert dataset.label_texts == ["zero", "one", "two", "three", "four"]
    assert dataset.splits["train"]["text"][:3] == ["first text", "", "third"]
    assert dataset.splits["train"]["labels"][:3] == [[0, 4], [], [2]]
    assert dataset.splits["test"][0] == {"text": "test text", "labels": [3]}
    split = read_text_split(tmp_path / "trn_X.txt", tmp_path / "trn_X_Y.txt", cache_dir=cache)
    assert split.label_count == 5 and len(split.dataset) == 3


def test_bow_file_labels_and_features(tmp_path, cache):
    path = write(tmp_path / "train.txt", "3 6 4\n1,3 0:0.5 5:2\n 2:1\n0 \n")
    split = read_bow_file(path, return_features=True, cache_dir=cache)
    assert split.label_count == 4
    assert split.dataset["labels"] == [[1, 3], [], [0]]
    assert "text" not in split.dataset.column_names
    expected = np.zeros((3, 6), np.float32)
    expected[0, 0], expected[0, 5], expected[1, 2] = 0.5, 2.0, 1.0
    np.testing.assert_array_equal(split.features.toarray(), expected)
    assert read_bow_file(path, cache_dir=cache).features is None


def test_bow_directory_and_split_form(tmp_path, cache):
    bow = tmp_path / "bow"
    bow.mkdir()
    write(bow / "eurlex_train.txt", "2 3 2\n0 0:1\n1 1:1 2:3\n")
    write(bow / "eurlex_test.txt", "1 3 2\n1 2:1\n")
    write(bow / "filter_labels_train.txt", "1 0\n")  # also matches *_train.txt, but is no data file
    dataset = load_xmc_dataset(bow, return_features=True, cache_dir=cache)
    assert dataset.format == "bow" and dataset.label_texts is None
    np.testing.assert_array_equal(dataset.filters["train"], [[1, 0]])
    assert dataset.splits["test"]["labels"] == [[1]]
    assert dataset.features["train"].shape == (2, 3) and dataset.features["test"].nnz == 1
    with pytest.raises(ValueError, match="needs label texts"):
        load_xmc_dataset(bow, add_label_texts=True, cache_dir=cache)
    write(bow / "other_test.txt", "1 3 2\n0 0:1\n")  # two test files: which one is meant cannot be guessed
    with pytest.raises(
        ValueError, match=r"several bag-of-words test files in .*\['eurlex_test.txt', 'other_test.txt'\]"
    ):
        load_xmc_dataset(bow, cache_dir=cache)
    (bow / "other_test.txt").unlink()

    split = tmp_path / "split"
    split.mkdir()
    write(split / "trn_X_Xf.txt", "2 4\n0:1 3:0.25\n\n")
    write(split / "trn_X_Y.txt", "2 3\n2:1\n0:1 1:1\n")
    assert detect_format(split) == "bow_split"
    dataset = load_xmc_dataset(split, return_features=True, cache_dir=cache)
    assert dataset.splits["train"]["labels"] == [[2], [0, 1]]
    np.testing.assert_array_equal(dataset.features["train"].toarray(), [[1, 0, 0, 0.25], [0, 0, 0, 0]])
    assert read_sparse_label_split(split / "trn_X_Y.txt", cache_dir=cache).label_count == 3
    assert read_sparse_features(split / "trn_X_Xf.txt").shape == (2, 4)
    write(split / "trn_X_Xf.txt", "3 4\n0:1\n1:1\n2:1\n")  # a row more than the labels file
    with pytest.raises(ValueError, match=r"split: train has 3 feature rows, 2 labels"):
        load_xmc_dataset(split, return_features=True, cache_dir=cache)


def test_detection_errors(tmp_path, json_dir, cache):
    with pytest.raises(ValueError, match="cannot tell the format"):
        detect_format(tmp_path)
    with pytest.raises(ValueError, match="bag-of-words"):
        load_xmc_dataset(json_dir, return_features=True, cache_dir=cache)


def test_read_filter_file(tmp_path):
    path = write(tmp_path / "filter_labels_test.txt", "0 5\n\n3 1\n")
    pairs = read_filter_file(path)
    assert pairs.dtype == np.int64
    np.testing.assert_array_equal(pairs, [[0, 5], [3, 1]])
    assert read_filter_file(write(tmp_path / "empty.txt", "")).shape == (0, 2)


MALFORMED = [
    # (file name, content, reader, line in the error, message fragment)
    ("train.txt", "3 5\n0 1:1\n", "bow", 1, "bad header"),
    ("train.txt", "", "bow", 1, "empty file"),
    ("train.txt", "2 5 3\n0 1:1\n3 1:1\n", "bow", 3, "label id 3 is outside [0, 3)"),
    ("train.txt", "2 5 3\n0,x 1:1\n1 1:1\n", "bow", 2, "must be integers"),
    ("train.txt", "3 5 3\n0 1:1\n1 1:1\n", "bow", 4, "announces 3 rows but the file has 2"),
    ("train.txt", "1 5 3\n0 1:1\n1 1:1\n", "bow", 3, "more rows than the 1"),
    ("train.txt", "2 5 3\n0 1:1\n1 1:x\n", "bow_features", 3, "feature index:value"),
    ("train.txt", "2 5 3\n0 1:1\n1 7:1\n", "bow_features", 3, "feature index 7 is outside [0, 5)"),
    ("train.txt", "2 5 3\n1,1 1:1\n1 1:1\n", "bow", 2, "duplicate label ids"),
    ("trn_X_Y.txt", "2 4\n1:1\n4:1\n", "sparse_labels", 3, "label id 4 is outside [0, 4)"),
    ("trn_X_Y.txt", "2 4\n1:1\n2\n", "sparse_labels", 3, "label id:value"),
    ("trn_X_Y.txt", "2 x\n1:1\n2:1\n", "sparse_labels", 1, "bad header"),
    ("trn_X_Y.txt", "1 4\n1:1\n2:1\n", "sparse_labels", 3, "more rows than the 1"),
    ("trn_X_Xf.txt", "1 4\n1:1\n2:1\n", "features", 3, "more rows"),
    ("trn.json", '{"title": "a", "target_ind": [0]}\n{"title": "b", "target_ind": [\n', "json", 2, "invalid JSON"),
    (
        "trn.json",
        '{"title": "a", "target_ind": [0]}\n\n{"title": "b", "target_ind": [2]}\n',
        "json",
        3,
        "outside [0, 2)",
    ),
    ("trn.json", '{"content": "a", "target_ind": [0]}\n', "json", 1, "`title`"),
    ("trn.json", '{"title": "a", "target_ind": 1}\n', "json", 1, "`target_ind`"),
    ("trn.json", '{"title": "a", "target_ind": [-1]}\n', "json", 1, "outside [0, 2)"),
    (
        "trn.json",
        '{"title": "a", "target_ind": [0]}\n{"title": "b", "target_ind": [1, 0, 1]}\n',
        "json",
        2,
        "duplicate",
    ),
    ("trn.json", '{"title": "a", "target_ind": [0]}\n{"title": 5, "target_ind": [1]}\n', "json", 2, "`title`"),
    ("trn.json", '{"title": "a", "target_ind": [0]}\n', "json_content", 1, "`content`"),
    ("filter_labels_test.txt", "0 1\n0 1 2\n", "filter", 2, "doc_idx label_idx"),
    ("filter_labels_test.txt", "0 1\n5 1\n", "filter", 2, "doc_idx 5 is outside [0, 3)"),
    ("filter_labels_test.txt", "0 9\n", "filter", 1, "label_idx 9 is outside [0, 4)"),
]


def test_json_split_read_by_pyarrow_is_the_line_readers(tmp_path, cache, monkeypatch):
    """A JSON-lines split is read by pyarrow into memory (2M points in seconds, issue 37): the same dataset as the
    line-by-line reader's, blank lines, empty label lists, empty contents and non-ASCII texts included."""
    from haste_hf import xmc_files

    records = [
        {"title": "a b", "content": "c", "target_ind": [3, 1]},
        {"title": "é ü", "content": "", "target_ind": []},
        {"title": "x", "content": "y z", "target_ind": [0]},
    ]
    path = write(tmp_path / "trn.json.gz", json_lines(records[:2]) + "\n" + json_lines(records[2:]))
    for fields in ("title", "title_content"):
        fast = read_json_split(path, 4, text_fields=fields, cache_dir=cache).dataset
        assert fast.cache_files == []  # read by pyarrow, in memory
        with monkeypatch.context() as patch:
            patch.setattr(xmc_files, "_fast_json_split", lambda *args: None)
            exact = read_json_split(path, 4, text_fields=fields, cache_dir=cache).dataset
        assert exact.cache_files  # read line by line, through the cache
        assert fast.features == exact.features and fast.to_dict() == exact.to_dict()
        assert fast.split == exact.split and fast.num_rows == 3


def test_a_label_listed_twice_is_found_with_a_sort_only_where_a_point_lists_its_ids_out_of_order(monkeypatch):
    """Points listing their ids in increasing order (the repository's files) are checked in one pass: the lexsort of
    every (point, id) pair took tens of seconds of the read at 110M positives. Out of order, the sort decides."""
    import numpy as np

    from haste_hf.xmc_files import _lists_a_label_twice

    def twice(*points):
        ids = np.array([label for point in points for label in point], dtype=np.int64)
        return _lists_a_label_twice(ids, np.array([len(point) for point in points], dtype=np.int64))

    sorts, lexsort = [], np.lexsort
    monkeypatch.setattr(np, "lexsort", lambda *args: sorts.append(1) or lexsort(*args))
    assert not twice([1, 5], [5, 7], [], [0], [], [2, 3]) and not twice([], []) and not twice([4])
    assert sorts == []  # in order, no sort: a point may end with the id the next one starts with
    assert twice([1, 5, 5], [6]) and twice([0, 2], [3, 1, 3]) and not twice([5, 1], [1, 5]) and not twice([2, 0], [0])
    assert len(sorts) == 4


def test_json_reads_parse_only_the_fields_they_use(tmp_path, cache, monkeypatch):
    """pyarrow parses the fields a read uses and skips the others (issue 37: 2M contents and 8.6M label uids held
    for a title-only run): a title-only split whose contents and uids are of mixed types (which pyarrow cannot
    infer one column of) is still read by pyarrow, into the line reader's dataset, and no other column is held."""
    from haste_hf import xmc_files

    records = [
        {"uid": "a", "title": "a b", "content": 7, "target_ind": [3, 1]},
        {"uid": 2, "title": "c", "content": ["d"], "target_ind": []},
    ]
    path = write(tmp_path / "trn.json", json_lines(records))
    fast = read_json_split(path, 4, cache_dir=cache).dataset
    assert fast.cache_files == []  # read by pyarrow
    with monkeypatch.context() as patch:
        patch.setattr(xmc_files, "_fast_json_split", lambda *args: None)
        exact = read_json_split(path, 4, cache_dir=cache).dataset
    assert fast.to_dict() == exact.to_dict() == {"text": ["a b", "c"], "labels": [[3, 1], []]}
    import pyarrow as pa

    assert xmc_files._read_json_columns(Path(path), {"title": pa.string()}).column_names == ["title"]
    labels = write(tmp_path / "lbl.json", json_lines([{"uid": 1, "title": "x"}, {"uid": "y", "title": "z"}]))
    monkeypatch.setattr(xmc_files, "_iter_lines", None)  # the line reader would fail: pyarrow reads the titles
    assert xmc_files.read_json_label_texts(labels) == ["x", "z"]


@pytest.mark.parametrize("name,content,reader,line,fragment", MALFORMED)
@pytest.mark.parametrize("compress", [False, True])
def test_malformed_input_names_file_and_line(tmp_path, cache, name, content, reader, line, fragment, compress):
    path = write(tmp_path / (name + (".gz" if compress else "")), content)
    readers = {
        "bow": lambda: read_bow_file(path, cache_dir=cache),
        "bow_features": lambda: read_bow_file(path, return_features=True, cache_dir=cache),
        "sparse_labels": lambda: read_sparse_label_split(path, cache_dir=cache),
        "features": lambda: read_sparse_features(path),
        "json": lambda: read_json_split(path, 2, cache_dir=cache),
        "json_content": lambda: read_json_split(path, 2, text_fields="title_content", cache_dir=cache),
        "filter": lambda: read_filter_file(path, num_points=3, label_count=4),
    }
    with pytest.raises(XMCFormatError) as error:
        readers[reader]()
    assert isinstance(error.value, ValueError)
    message = str(error.value)
    assert str(path) in message and f"line {line}:" in message and fragment in message


@pytest.mark.parametrize(
    "name, content, fragment",
    [
        ("trn.json", "", "no JSON line"),
        ("trn.json", "\n\n", "no JSON line"),
        ("trn_X_Y.txt", "0 3\n", "its header announces 0 rows"),
        ("train.txt", "0 5 3\n", "its header announces 0 rows"),
    ],
)
def test_a_file_of_no_points_is_refused_naming_it(tmp_path, cache, name, content, fragment):
    path = write(tmp_path / name, content)
    read = {
        "trn.json": lambda: read_json_split(path, 2, cache_dir=cache),
        "trn_X_Y.txt": lambda: read_sparse_label_split(path, cache_dir=cache),
        "train.txt": lambda: read_bow_file(path, cache_dir=cache),
    }[name]
    with pytest.raises(
        XMCFormatError, match=re.escape(f"{path}: the file holds no points ({fragment}); a split needs at least one")
    ):
        read()


def test_text_and_label_counts_must_agree(tmp_path, cache):
    write(tmp_path / "trn_X_Y.txt", "2 3\n0:1\n1:1\n")
    write(tmp_path / "more_X.txt", "a\nb\nc\n")
    with pytest.raises(XMCFormatError, match=r"more_X.txt, line 3: more texts"):
        read_text_split(tmp_path / "more_X.txt", tmp_path / "trn_X_Y.txt", cache_dir=cache)
    write(tmp_path / "fewer_X.txt", "a\n")
    with pytest.raises(XMCFormatError, match=r"fewer_X.txt, line 2: fewer texts"):
        read_text_split(tmp_path / "fewer_X.txt", tmp_path / "trn_X_Y.txt", cache_dir=cache)


def test_invalid_utf8_names_line(tmp_path, cache):
    path = tmp_path / "trn.json"
    path.write_bytes(b'{"title": "a", "target_ind": [0]}\n{"title": "\xff", "target_ind": [0]}\n')
    with pytest.raises(XMCFormatError, match=r"trn.json, line 2: not valid UTF-8"):
        read_json_split(path, 2, cache_dir=cache)


def test_a_directory_that_is_no_dataset_is_refused_naming_what_is_missing(tmp_path, json_dir, cache):
    """A file for a directory, JSON data without its label texts, a format whose training split is not there, and
    a test split of another label count are each refused in one line naming the directory."""
    with pytest.raises(ValueError, match=r"trn.json.gz is not a directory"):
        detect_format(json_dir / "trn.json.gz")
    with pytest.raises(ValueError, match=r"no training split found in .*json_data for format 'text_sparse'"):
        load_xmc_dataset(json_dir, format="text_sparse", cache_dir=cache)
    (json_dir / "lbl.json.gz").unlink()
    with pytest.raises(ValueError, match=r"json_data has trn.json\[.gz\] but no lbl.json\[.gz\]"):
        load_xmc_dataset(json_dir, cache_dir=cache)
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    write(sparse / "trn_X.txt", "a\n")
    write(sparse / "trn_X_Y.txt", "1 3\n0:1\n")
    write(sparse / "tst_X.txt", "b\n")
    write(sparse / "tst_X_Y.txt", "1 4\n1:1\n")
    with pytest.raises(ValueError, match=r"sparse: the test split declares 4 labels, train 3"):
        load_xmc_dataset(sparse, cache_dir=cache)


def test_a_missing_source_file_is_named_and_a_readers_other_failure_is_not_swallowed(tmp_path, cache):
    """A split whose file is missing is refused naming it; an error inside a reader that is not a format error
    reaches the caller as `datasets` raised it (never a silent None)."""
    from datasets import Features, Value
    from datasets.exceptions import DatasetGenerationError

    from haste_hf.xmc_files import _generate

    write(tmp_path / "trn_X.txt", "a\n")
    with pytest.raises(FileNotFoundError, match=r"trn_X_Y.txt does not exist"):
        read_text_split(tmp_path / "trn_X.txt", tmp_path / "trn_X_Y.txt", cache_dir=cache)

    def failing_reader():
        raise OSError("the disk went away")
        yield

    with pytest.raises(DatasetGenerationError):
        _generate(failing_reader, {}, Features({"text": Value("string")}), "train", cache)


def test_a_bag_of_words_file_named_for_its_split_alone_is_read(tmp_path, cache):
    """`train.txt` (no dataset prefix) is the training file, and is preferred to a `*_train.txt` beside it."""
    write(tmp_path / "train.txt", "2 3 2\n0 0:1\n1 1:1 2:3\n")
    write(tmp_path / "other_train.txt", "1 3 2\n1 0:1\n")
    dataset = load_xmc_dataset(tmp_path, cache_dir=cache)
    assert dataset.format == "bow" and dataset.splits["train"]["labels"] == [[0], [1]]


def test_label_frequencies_refuse_an_id_outside_the_label_count(json_dir, cache):
    train = load_xmc_dataset(json_dir, cache_dir=cache).splits["train"]
    assert label_frequencies(train, 4).tolist() == [3, 1, 1, 1]
    with pytest.raises(ValueError, match=r"label ids must lie in \[0, label_count=3\), found \[0, 3\]"):
        label_frequencies(train, 3)


def test_label_frequencies_of_many_labels_take_int32_counts_and_no_array_per_batch():
    """Every rank counts the training labels: 1M labels' counts are int32 (4 MB), and a batch adds its own ids' counts
    without a `[L]` array of its own (a bincount per batch took 8 MB more each, 8 GB at 10^9 labels); the counts are
    exact, repeated ids and several batches included."""
    import tracemalloc

    from datasets import Dataset

    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 1_000_000, rng.integers(0, 4)).tolist() for _ in range(70_000)] + [[7, 7, 7]]
    train = Dataset.from_dict({"labels": rows})
    tracemalloc.start()
    counts = label_frequencies(train, 1_000_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert counts.dtype == np.int32 and peak < 8_000_000, peak
    np.testing.assert_array_equal(
        counts, np.bincount(np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]), minlength=1_000_000)
    )


def test_label_counts_must_match_between_files(tmp_path, cache):
    write(tmp_path / "trn_X.txt", "a\n")
    write(tmp_path / "trn_X_Y.txt", "1 3\n0:1\n")
    write(tmp_path / "Y.txt", "zero\none\n")
    with pytest.raises(ValueError, match="2 label texts for 3 labels"):
        load_xmc_dataset(tmp_path, cache_dir=cache)


def test_demo_dataset(cache):
    dataset = load_xmc_dataset(demo_dataset_path(), text_fields="title_content", cache_dir=cache)
    assert (len(dataset.splits["train"]), len(dataset.splits["test"]), dataset.label_count) == (3000, 800, 452)
    frequencies = dataset.train_label_frequencies
    assert frequencies.min() >= 1 and np.all(np.diff(frequencies) <= 0)  # all seen, most frequent first
    assert all(labels for labels in dataset.splits["test"]["labels"])
    assert sum(p.stat().st_size for p in demo_dataset_path().glob("*.gz")) < 700_000


@pytest.mark.skipif(not REAL_DEPS.is_file(), reason="debian-xmc not available")
def test_streams_first_rows_of_large_real_file():
    rows = list(itertools.islice(_json_rows(str(REAL_DEPS), 43_054, "title_content"), 3))
    assert len(rows) == 3 and all(row["text"] and row["labels"] for row in rows)


# ----------------------------------------------------------------------------------------------------------
# Collator


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {"[PAD]": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def test_collator_pads_text_and_label_ids(tokenizer):
    collator = XMCDataCollator(tokenizer, max_length=3)
    batch = collator(
        [{"text": "a b c a", "labels": [7, 1, 4]}, {"text": "b", "labels": []}, {"text": "c a", "labels": [2]}]
    )
    torch.testing.assert_close(batch["input_ids"], torch.tensor([[2, 3, 4], [3, 0, 0], [4, 2, 0]]))
    torch.testing.assert_close(batch["attention_mask"], torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]]))
    assert batch["labels"].dtype == torch.int64
    torch.testing.assert_close(batch["labels"], torch.tensor([[7, 1, 4], [-100, -100, -100], [2, -100, -100]]))

    no_positives = collator([{"text": "a", "labels": []}, {"text": "b", "labels": []}])
    torch.testing.assert_close(no_positives["labels"], torch.full((2, 1), -100))
    assert "labels" not in collator([{"text": "a"}])


def test_collator_errors(tokenizer):
    collator = XMCDataCollator(tokenizer)
    with pytest.raises(KeyError, match="remove_unused_columns=False"):
        collator([{"labels": [0], "title": "no text column"}])
    with pytest.raises(ValueError, match="non-negative"):
        pad_label_ids([[1, -3]])
    bounded = XMCDataCollator(tokenizer, label_count=8)
    assert bounded([{"text": "a", "labels": [7]}])["labels"].tolist() == [[7]]
    with pytest.raises(ValueError, match="label_count=8"):
        bounded([{"text": "a", "labels": [2]}, {"text": "b", "labels": [8]}])


def test_collator_pads_pre_tokenized_examples_and_refuses_one_longer_than_its_max_length(tokenizer):
    """Examples that carry `input_ids` are padded as they are (the tokenizer's input names they hold, nothing else);
    an example of exactly `max_length` tokens passes, one token more is refused; an empty batch is refused."""
    collator = XMCDataCollator(tokenizer, max_length=3)
    examples = [
        {"input_ids": [2, 3], "attention_mask": [1, 1], "labels": [1], "text": "ignored"},
        {"input_ids": [4, 2, 3], "attention_mask": [1, 1, 1], "labels": [0, 2], "text": "ignored"},
    ]
    batch = collator(examples)
    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    assert batch["input_ids"].tolist() == [[2, 3, 0], [4, 2, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["labels"].tolist() == [[1, -100], [0, 2]]
    assert collator(examples[:1])["input_ids"].tolist() == [[2, 3]]
    too_long = {"input_ids": [2, 3, 4, 2], "attention_mask": [1, 1, 1, 1], "labels": [1]}
    with pytest.raises(ValueError, match="a pre-tokenized example has 4 tokens, more than the collator's max_length=3"):
        collator([examples[0], too_long])
    with pytest.raises(ValueError, match="cannot collate an empty batch"):
        collator([])


def test_label_id_padding_packs_ragged_ids_passes_even_ones_on_and_refuses_examples_without_tokens(tokenizer):
    """`LabelIdPadding` around `DataCollatorWithPadding` (what `HasteTrainer` makes of it): tokenized examples get
    their token columns padded by the collator and their ragged label ids padded with -100, text columns left out;
    labels of one length go to the collator as they are; examples without `input_ids` are refused in one line naming `XMCDataCollator`."""
    from transformers import DataCollatorWithPadding

    padding = LabelIdPadding(DataCollatorWithPadding(tokenizer))
    features = [
        {"input_ids": [2, 3, 4], "text": "a b c", "labels": [7, 1, 4]},
        {"input_ids": [3], "text": "b", "labels": [2]},
    ]
    batch = padding(features)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[2, 3, 4], [3, 0, 0]]
    assert batch["labels"].tolist() == [[7, 1, 4], [2, -100, -100]]
    # Labels of one length (multi-hot rows here) go to the collator with the tokens, as they would without the wrap.
    multi_hot = [
        {"input_ids": [2, 3], "text": "a b", "labels": [0.0, 1.0, 1.0]},
        {"input_ids": [4], "text": "c", "labels": [1.0, 0.0, 0.0]},
    ]
    batch = padding(multi_hot)
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[2, 3], [4, 0]]
    assert batch["labels"].tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match=r"no `input_ids`.*haste_hf.XMCDataCollator\(tokenizer\)"):
        padding([{"text": "a b", "labels": [1]}, {"text": "c", "labels": [2, 3]}])


def test_collator_on_loaded_dataset(json_dir, cache, tokenizer):
    train = load_xmc_dataset(json_dir, cache_dir=cache).splits["train"]
    batch = XMCDataCollator(tokenizer, max_length=8)([train[i] for i in range(3)])
    torch.testing.assert_close(batch["labels"], torch.tensor([[0, 2, -100], [0, -100, -100], [3, 0, 1]]))
