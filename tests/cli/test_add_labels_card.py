"""`haste-hf add-labels` says what it does while it does it (progress over the embedding of the texts and the fit)
and leaves a model card that records each addition: which labels, how, when."""

import datetime
import json
import re

import pytest
from tiny_encoders import tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.cli import main
from haste_hf.model_card import (
    ADDED_LABELS_HEADING,
    ADDED_LABELS_LISTED,
    HasteModelCardData,
    LabelAddition,
    card_with_added_labels,
    render_model_card,
)


LABELS = 30


def saved_model(folder, card=None):
    model = make_tiny_model(label_count=LABELS, head_label_count=3, training=False)
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    if card is not None:
        (folder / "README.md").write_text(card)
    return model


def run_add_labels(model, labels, output, capsys, *extra):
    labels_file = output.parent / f"{output.name}.json"
    labels_file.write_text(json.dumps(labels))
    argv = ["add-labels", "--model", str(model), "--labels", str(labels_file), "--output-dir", str(output), *extra]
    assert main(argv) == 0
    return capsys.readouterr()


def test_add_labels_shows_progress_and_appends_each_addition_to_the_card(tmp_path, capsys, dataset_dir):
    saved_model(tmp_path / "model", card="---\nlicense: apache-2.0\n---\n# The trained model\n\nP@1 60.\n")
    before = datetime.datetime.now(datetime.timezone.utc).replace(second=0, microsecond=0)
    labels = [{"name": "planted", "text": "w90 | w91"}, {"name": "other", "text": "w92"}]
    output = run_add_labels(tmp_path / "model", labels, tmp_path / "added", capsys, "--negatives", str(dataset_dir))
    for step in ("Label texts", "Mapping label texts to weights", "Fitting the new labels"):  # the long steps
        assert step in output.err, step
    assert f"2 labels added to the head (ids 30 to 31) -> {tmp_path / 'added'}" in output.out
    card = (tmp_path / "added" / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0\n---\n# The trained model\n\nP@1 60.\n")  # the card before
    assert card.count(ADDED_LABELS_HEADING) == 1
    entry = re.search(r"### (\d{4}-\d\d-\d\d \d\d:\d\d) UTC: 2 labels, ids 30 to 31, in the head", card)
    assert entry is not None
    when = datetime.datetime.strptime(entry.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=datetime.timezone.utc)
    assert before <= when <= datetime.datetime.now(datetime.timezone.utc)
    assert "fitted on each label's text against 160 negative training texts" in card
    assert "| 30 | planted | w90 \\| w91 |" in card and "| 31 | other | w92 |" in card

    # Without negatives, into a new folder from the one above: a second entry below the first.
    output = run_add_labels(tmp_path / "added", [{"name": "third", "text": "w93"}], tmp_path / "again", capsys)
    assert "Fitting the new labels" not in output.err  # nothing fitted
    again = (tmp_path / "again" / "README.md").read_text()
    assert again.startswith(card) and again.count(ADDED_LABELS_HEADING) == 1
    assert "1 label, ids 32 to 32, in the head" in again and "placed from their texts alone" in again


def test_the_card_of_the_new_folder_loads_it_and_counts_its_labels(tmp_path, capsys):
    """The card copied from the trained folder told users to load that folder (without the added labels) and gave its
    label count: it names the new folder, and counts the labels trained and added."""
    model = saved_model(tmp_path / "model")
    card = str(render_model_card(HasteModelCardData.from_model(model, model_id="model")))
    assert 'from_pretrained("model")' in card and "| Labels | 30 |" in card
    (tmp_path / "model" / "README.md").write_text(card)
    run_add_labels(tmp_path / "model", [{"name": "new", "text": "w90"}], tmp_path / "added", capsys)
    added = (tmp_path / "added" / "README.md").read_text()
    assert 'from_pretrained("added")' in added and 'from_pretrained("model")' not in added
    assert "\n# added\n" in added and "| Labels | 31 (30 trained, 1 added below) |" in added
    run_add_labels(tmp_path / "added", [{"name": "third", "text": "w93"}], tmp_path / "again", capsys)
    again = (tmp_path / "again" / "README.md").read_text()
    assert 'from_pretrained("again")' in again and '"added"' not in again
    assert "| Labels | 32 (30 trained, 2 added below) |" in again


@pytest.mark.parametrize(
    ("flags", "branch"), [([], "head"), (["--branch", "head"], "head"), (["--branch", "tail"], "tail")]
)
def test_add_labels_puts_the_labels_in_the_head_by_default_or_where_asked_and_says_so(tmp_path, capsys, flags, branch):
    saved_model(tmp_path / "model")
    output = run_add_labels(tmp_path / "model", [{"name": "new", "text": "w90"}], tmp_path / "added", capsys, *flags)
    assert f"added to the {branch} (ids 30 to 30) -> {tmp_path / 'added'}" in output.out
    assert f"1 label, ids 30 to 30, in the {branch}" in (tmp_path / "added" / "README.md").read_text()
    config = json.loads((tmp_path / "added" / "config.json").read_text())
    assert (config["label_count"], config["head_label_count"]) == (LABELS + 1, 4 if branch == "head" else 3)


def test_a_model_without_a_card_gets_one_and_a_linked_card_is_not_read(tmp_path, capsys):
    saved_model(tmp_path / "model")
    run_add_labels(tmp_path / "model", [{"name": "new", "text": "w90"}], tmp_path / "added", capsys)
    card = (tmp_path / "added" / "README.md").read_text()
    assert "labels: 31" not in card and ADDED_LABELS_HEADING in card and "| 30 | new | w90 |" in card
    assert "## Usage" in card  # rendered from the model's template

    secret = tmp_path / "secret.txt"
    secret.write_text("not a card")
    (tmp_path / "added" / "README.md").unlink()
    (tmp_path / "added" / "README.md").symlink_to(secret)
    run_add_labels(tmp_path / "added", [{"name": "newer", "text": "w91"}], tmp_path / "again", capsys)
    card = (tmp_path / "again" / "README.md").read_text()
    assert "not a card" not in card and not (tmp_path / "again" / "README.md").is_symlink()


def test_a_long_addition_lists_its_first_labels_and_counts_the_rest():
    count = ADDED_LABELS_LISTED + 7
    addition = LabelAddition(
        ids=list(range(100, 100 + count)),
        names=None,
        texts=[f"text {i}\nsecond line" for i in range(count)],
        branch="head",
        example_count=12,
        negative_count=1000,
        when=datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc),
    )
    text = card_with_added_labels("# card\n", None, "m", addition)
    assert f"### 2026-01-02 03:04 UTC: {count} labels, ids 100 to {99 + count}, in the head" in text
    assert "and 12 example texts against 1,000 negative training texts" in text
    assert "| 100 | LABEL_100 | text 0 second line |" in text
    assert text.count("| LABEL_") == ADDED_LABELS_LISTED and "and 7 more" in text
