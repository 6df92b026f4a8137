"""The label layout: built once from a training split, saved as one file, checked against split and model."""

import os
import stat

import pytest
import torch
from datasets import Dataset
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tiny_encoders import planted_texts, tiny_encoder_config, tiny_tokenizer
from transformers import BertModel

from haste_hf import DEFAULT_HEAD_LABEL_FRACTION, HasteForExtremeClassification
from haste_hf.labels.layout import LAYOUT_FORMAT_VERSION, LabelLayout, count_labels, split_head_tail


LABELS = 40


@pytest.fixture(scope="module")
def split():
    return Dataset.from_list(planted_texts(LABELS, 120, seed=0, labels_per_text=3))


@pytest.fixture(scope="module")
def encoder_and_tokenizer(tmp_path_factory):
    torch.manual_seed(0)
    return BertModel(tiny_encoder_config("bert"), add_pooling_layer=False), tiny_tokenizer(
        tmp_path_factory.mktemp("tok")
    )


def test_counts_and_fingerprint_of_a_dataset_match_those_of_its_lists(split):
    counts, fingerprint, points = count_labels(split, LABELS)
    list_counts, list_fingerprint, list_points = count_labels(split["labels"], LABELS)
    assert counts.tolist() == list_counts.tolist() and fingerprint == list_fingerprint and points == list_points == 120
    assert counts.sum() == sum(len(labels) for labels in split["labels"])
    # Another split of the same data (one point less, or the same points in another order) has another fingerprint.
    assert count_labels(split.select(range(119)), LABELS)[1] != fingerprint
    assert count_labels(split.shuffle(seed=1), LABELS)[1] != fingerprint
    with pytest.raises(ValueError, match=r"\[0, 40\)"):
        count_labels([[0, 40]], LABELS)


def test_counting_many_batches_of_many_labels_adds_up_the_label_vector_once(monkeypatch):
    """A batch of points holds few of 10^8 labels: a `[label_count]` bincount per batch (62 of 800 MB for 4M points)
    took most of the label counts' time. Each batch is counted by a sort of its own ids, with the same counts."""
    import numpy as np

    import haste_hf.data
    import haste_hf.labels.layout

    monkeypatch.setattr(haste_hf.labels.layout, "_BATCH_POINTS", 4)  # 50 points: 13 batches
    generator = np.random.default_rng(0)
    lists = [generator.choice(1_000_000, size=1 + i % 5, replace=False).tolist() for i in range(50)]
    expected = np.zeros(1_000_000, dtype=np.int64)
    for labels in lists:
        expected[labels] += 1
    calls, bincount = [], np.bincount
    monkeypatch.setattr(np, "bincount", lambda *args, **kwargs: calls.append(1) or bincount(*args, **kwargs))
    for counted in (
        count_labels(Dataset.from_dict({"labels": lists}), 1_000_000)[0],
        count_labels(lists, 1_000_000)[0],
    ):
        assert np.array_equal(counted, expected)
    frequencies = haste_hf.data.label_frequencies(Dataset.from_dict({"labels": lists}), 1_000_000)
    assert np.array_equal(frequencies, expected) and calls == []  # no [label_count] bincount of a batch


def test_a_split_of_more_points_than_a_batch_has_one_fingerprint_as_dataset_and_as_lists(monkeypatch):
    import haste_hf.labels.layout

    monkeypatch.setattr(haste_hf.labels.layout, "_BATCH_POINTS", 7)  # 20 points: batches of 7, 7 and 6
    lists = [[i % LABELS, (3 * i) % LABELS][: 1 + i % 2] for i in range(20)]
    counts, fingerprint, points = count_labels(Dataset.from_dict({"labels": lists}), LABELS)
    assert count_labels(lists, LABELS)[1] == fingerprint and points == 20
    assert count_labels(lists, LABELS)[0].tolist() == counts.tolist() and count_labels([], LABELS)[2] == 0


def test_fingerprint_depends_on_where_each_points_labels_start_and_end():
    # The same ids in the same order, cut into points differently: another split.
    assert count_labels([[1, 2], [3]], LABELS)[1] != count_labels([[1], [2, 3]], LABELS)[1]
    assert count_labels([[1, 2, 3], []], LABELS)[1] != count_labels([[], [1, 2, 3]], LABELS)[1]


@pytest.mark.parametrize("strategy", ["semantic", "frequency", "random"])
def test_layout_of_a_training_split(split, encoder_and_tokenizer, strategy):
    encoder, tokenizer = encoder_and_tokenizer
    layout = LabelLayout.from_training_split(
        split,
        LABELS,
        group_size=4,
        strategy=strategy,
        encoder=encoder,
        tokenizer=tokenizer,
        max_length=16,
        device="cpu",
        show_progress=False,
    )
    counts, fingerprint, _ = count_labels(split, LABELS)
    head, tail = split_head_tail(counts, head_label_fraction=DEFAULT_HEAD_LABEL_FRACTION)
    assert layout.head_ids.tolist() == head.tolist()  # the paper's 3% of 40 labels: 1
    assert sorted(layout.tail_order.tolist()) == sorted(tail.tolist())
    assert layout.split_fingerprint == fingerprint and layout.train_points == 120
    assert layout.label_frequencies.tolist() == counts.tolist()
    assert (layout.group_size, layout.strategy, layout.tail_group_count) == (4, strategy, 10)
    output_labels = layout.output_labels()
    assert output_labels.shape == (1 + 10 * 4,) and output_labels[-1] == -1  # 39 tail labels: one padding slot


def test_save_load_round_trip_is_one_safetensors_file(split, tmp_path):
    layout = LabelLayout.from_training_split(split, LABELS, 8, head_label_count=5, strategy="random", seed=3)
    path = tmp_path / "layout.safetensors"
    previous = os.umask(0o027)
    try:
        layout.save(path)
    finally:
        os.umask(previous)
    assert [p.name for p in tmp_path.iterdir()] == ["layout.safetensors"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # a new file's mode, not mkstemp's 0o600
    loaded = LabelLayout.load(path)
    for name in ("label_count", "group_size", "strategy", "seed", "split_fingerprint", "train_points"):
        assert getattr(loaded, name) == getattr(layout, name), name
    for name in ("head_ids", "tail_order", "label_frequencies"):
        assert torch.equal(getattr(loaded, name), getattr(layout, name)), name
    save_file({"order": torch.arange(4)}, tmp_path / "grouping.safetensors", metadata={"group_size": "2"})
    with pytest.raises(ValueError, match="not a label layout file"):
        LabelLayout.load(tmp_path / "grouping.safetensors")


def test_a_layout_of_a_newer_format_is_refused(tmp_path):
    path = tmp_path / "layout.safetensors"
    LabelLayout(label_count=4, head_ids=[0], tail_order=[1, 2, 3], group_size=2).save(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata()
    newer = tmp_path / "newer.safetensors"
    save_file(load_file(path), newer, metadata={**metadata, "format_version": str(LAYOUT_FORMAT_VERSION + 1)})
    with pytest.raises(ValueError, match=f"layout format {LAYOUT_FORMAT_VERSION + 1}.*upgrade haste_hf"):
        LabelLayout.load(newer)


def test_check_split_refuses_another_split(split):
    layout = LabelLayout.from_training_split(split, LABELS, 4, strategy="frequency")
    layout.check_split(split)
    held_out = split.train_test_split(test_size=0.1, seed=0)["train"]
    with pytest.raises(
        ValueError, match=r"another training split \(120 points\).*\(108 points\).*--validation-fraction"
    ):
        layout.check_split(held_out)
    # Another split of the same size (another hold-out, or the same points in another order) is refused too.
    for same_size in (split.shuffle(seed=1), Dataset.from_list(planted_texts(LABELS, 120, seed=1, labels_per_text=3))):
        with pytest.raises(
            ValueError, match=r"another training split than the training split, of as many points \(120\)"
        ):
            layout.check_split(same_size)


def test_layout_must_partition_the_labels():
    with pytest.raises(ValueError, match="exactly once"):
        LabelLayout(label_count=5, head_ids=[0], tail_order=[1, 2, 3], group_size=2)
    with pytest.raises(ValueError, match="exactly once"):
        LabelLayout(label_count=3, head_ids=[0, 1], tail_order=[1, 2], group_size=2)
    with pytest.raises(ValueError, match="strategy"):
        LabelLayout(label_count=2, head_ids=[0], tail_order=[1], group_size=1, strategy="alphabetical")


@pytest.mark.parametrize(
    "counts, named",
    [
        (
            dict(label_count=0, head_ids=[], tail_order=[], group_size=2),
            "`label_count` must be a positive integer, got 0",
        ),
        (
            dict(label_count=2, head_ids=[0, 1], tail_order=[], group_size=0),
            "`group_size` must be a positive integer, got 0",
        ),
        (dict(label_count=2, head_ids=[0], tail_order=[1], group_size=True), "`group_size` must be a positive integer"),
        (dict(label_count=2.0, head_ids=[0], tail_order=[1], group_size=1), "`label_count` must be a positive integer"),
    ],
)
def test_a_layouts_label_count_and_group_size_are_positive_integers(counts, named):
    with pytest.raises(ValueError, match=named):
        LabelLayout(**counts)


def test_semantic_layout_needs_embeddings_or_an_encoder(split):
    with pytest.raises(ValueError, match="encoder"):
        LabelLayout.from_training_split(split, LABELS, 4)
    with pytest.raises(ValueError, match="label_embeddings"):
        LabelLayout.from_frequencies(count_labels(split, LABELS)[0], 4)


def test_from_encoder_pretrained_builds_the_layout_and_checks_it(split, encoder_and_tokenizer):
    encoder, _ = encoder_and_tokenizer
    layout = LabelLayout.from_training_split(split, LABELS, 4, head_label_count=6, strategy="frequency")
    model = HasteForExtremeClassification.from_encoder_pretrained(encoder, layout=layout, fan_in=8)
    config = model.config
    assert (config.label_count, config.head_label_count, config.group_size) == (LABELS, 6, 4)
    assert torch.equal(model.output_layer.output_labels, layout.output_labels())
    assert torch.equal(LabelLayout.from_model(model).output_labels(), layout.output_labels())
    for wrong, message in (
        (dict(group_size=8), r"`group_size` \(8\) differs from the layout's G \(4\)"),
        (dict(label_count=LABELS + 1), r"`label_count` \(41\) differs"),
        (dict(head_label_count=2), r"`head_label_count` \(2\) differs"),
        (dict(label_frequencies=layout.label_frequencies), "leave out label_frequencies"),
        (dict(label_grouping=layout.grouping), "leave out label_grouping"),
    ):
        with pytest.raises(ValueError, match=message):
            HasteForExtremeClassification.from_encoder_pretrained(encoder, layout=layout, fan_in=8, **wrong)
