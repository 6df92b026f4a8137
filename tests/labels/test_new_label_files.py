"""The new labels' file of `haste-hf add-labels` (`read_new_labels`): its two forms; a name given twice is refused
naming it (`json` keeps the last of two keys, and one label of the two was added without a word)."""

import json

import pytest
from faults import cli_files  # noqa: F401 (the fixture: a saved 30-label model)

from haste_hf.cli import main
from haste_hf.labels.new_label_files import read_new_labels


@pytest.mark.parametrize(
    "text, key",
    [
        ('{"tag a": "w60 w61", "tag b": "w62", "tag a": "w63"}', "tag a"),
        ('[{"text": "w60", "name": "a", "text": "w61"}]', "text"),
    ],
)
def test_a_key_given_twice_is_refused_naming_it(tmp_path, text, key):
    path = tmp_path / "labels.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"names '{key}' twice"):
        read_new_labels(path)


def test_distinct_keys_read_in_order(tmp_path):
    path = tmp_path / "labels.json"
    path.write_text(json.dumps({"tag a": "w60 w61", "tag b": "w62"}))
    assert read_new_labels(path) == (["w60 w61", "w62"], ["tag a", "tag b"])


def test_a_list_of_entries_reads_in_order_with_names_for_all_or_none(tmp_path):
    path = tmp_path / "labels.json"
    path.write_text(json.dumps([{"text": "w60 w61", "name": "tag a"}, {"text": "w62", "name": "tag b"}]))
    assert read_new_labels(path) == (["w60 w61", "w62"], ["tag a", "tag b"])
    path.write_text(json.dumps([{"text": "w60"}, {"text": "w62"}]))
    assert read_new_labels(path) == (["w60", "w62"], None)
    path.write_text(json.dumps([{"text": "w60", "name": "tag a"}, {"text": "w62"}]))
    with pytest.raises(ValueError, match="entry 1 has no name; name every new label, or none"):
        read_new_labels(path)
    for entries in ("w60", ["w60"], [{"name": "tag a"}], [{"text": "w60"}, "w62"]):
        path.write_text(json.dumps(entries))
        with pytest.raises(ValueError, match=r'must hold a list of \{"text": ..., "name": ...\} objects, or an object'):
            read_new_labels(path)


def test_the_command_refuses_a_duplicate_name_in_one_line(cli_files, tmp_path, capsys):  # noqa: F811
    path = tmp_path / "labels.json"
    path.write_text('{"tag a": "w60 w61", "tag a": "w63"}')
    argv = ["add-labels", "--model", str(cli_files["model"]), "--labels", str(path)]
    status = main(argv + ["--output-dir", str(tmp_path / "out")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "twice" in line]
    assert status != 0 and len(errors) == 1 and "'tag a'" in errors[0], errors
    assert not (tmp_path / "out").exists()


def test_examples_of_labels_outside_the_new_ones_are_refused_naming_the_range():
    from datasets import Dataset

    from haste_hf.labels.new_label_files import examples_from_split

    split = Dataset.from_dict({"text": ["a", "b", "c"], "labels": [[0], [1, 0], []]})
    assert examples_from_split(split, 2) == [["a", "b"], ["b"]]
    for bad, count in (([[0], [2]], 2), ([[0], [-1]], 3)):
        with pytest.raises(
            ValueError, match=rf"^the examples tag label {bad[1][0]}, and the new labels are 0 to {count - 1}$"
        ):
            examples_from_split(Dataset.from_dict({"text": ["a", "b"], "labels": bad}), count)
