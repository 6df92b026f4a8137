"""Grouping within bands of training count (`group_labels(frequency_bands=...)`, `--frequency-bands`): a rare label
shares its group's support only with labels of its own band, each band is grouped by the strategy as it would be
alone, and every group but the last is full."""

import math

import pytest
import torch
import torch.nn.functional as F

from haste_hf.labels.grouping import frequency_bands_of, group_labels
from haste_hf.labels.layout import LabelLayout


def planted_tail(label_count=960, dim=32, topics=60, seed=0):
    """Embeddings of `topics` tight topics, each holding rare (1 point) and frequent (20-99 points) labels alike: plain
    semantic grouping puts rare and frequent labels of a topic in one group."""
    generator = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(topics, dim, generator=generator), dim=1)
    topic = torch.arange(label_count) % topics
    embeddings = F.normalize(centres[topic] + 0.05 * torch.randn(label_count, dim, generator=generator), dim=1)
    counts = torch.where(
        torch.arange(label_count) // topics % 2 == 0, 1, torch.randint(20, 100, (label_count,), generator=generator)
    )
    return embeddings, counts, topic


def assert_valid_grouping(grouping, label_ids, group_size):
    assert torch.equal(torch.sort(grouping.order).values, torch.sort(torch.as_tensor(label_ids)).values)
    filled = (grouping.groups() >= 0).sum(dim=1)
    assert filled.numel() == math.ceil(len(label_ids) / group_size) and bool((filled[:-1] == group_size).all())


def mixed_groups(grouping, counts):
    groups = grouping.groups()
    rare = torch.where(groups >= 0, counts[groups.clamp_min(0)] <= 1, False)
    frequent = torch.where(groups >= 0, counts[groups.clamp_min(0)] > 1, False)
    return int((rare.any(1) & frequent.any(1)).sum())


def test_bands_keep_rare_labels_among_themselves_and_group_each_band_semantically():
    embeddings, counts, topic = planted_tail()
    labels = torch.arange(960)
    plain = group_labels(embeddings, labels, 8, label_frequencies=counts, beta=2, device="cpu", seed=1)
    banded = group_labels(
        embeddings, labels, 8, label_frequencies=counts, frequency_bands=[1], beta=2, device="cpu", seed=1
    )
    assert mixed_groups(plain, counts) > 30  # the planted topics mix rare and frequent labels: the bands must separate
    assert mixed_groups(banded, counts) == 0  # 480 rare labels: 60 whole groups, no label moves up a band
    assert_valid_grouping(banded, labels, 8)
    # Inside a band, the groups are the semantic groups of that band alone (same seed): nothing else changes.
    rare_band, frequent_band = frequency_bands_of(labels, counts, [1], 8)
    for band, piece in zip((rare_band, frequent_band), (banded.order[:480], banded.order[480:])):
        alone = group_labels(embeddings, band, 8, label_frequencies=counts, beta=2, device="cpu", seed=1)
        assert torch.equal(piece, alone.order)
    pure = sum(topic[group].unique().numel() == 1 for group in banded.groups())
    assert pure >= 100  # still semantic: most groups lie inside one planted topic (a random grouping has none)


def test_each_band_holds_whole_groups_its_most_frequent_labels_moving_up():
    counts = torch.tensor([1, 1, 1, 3, 2, 9, 1, 5, 40, 7, 6])
    bands = frequency_bands_of(torch.arange(11), counts, [1, 5], group_size=2)
    # Count 1: labels 0, 1, 2, 6 (ascending count, then id); 2-5: 4, 3, 7 -> one whole group, 7 moves up; above: the rest.
    assert [band.tolist() for band in bands] == [[0, 1, 2, 6], [4, 3], [7, 10, 9, 5, 8]]
    bands = frequency_bands_of(torch.arange(11), counts, [1, 5], group_size=3)
    assert [band.tolist() for band in bands] == [[0, 1, 2], [6, 4, 3], [7, 10, 9, 5, 8]]
    # A band too small for one group is empty: its labels join the next band.
    assert [band.tolist() for band in frequency_bands_of(torch.arange(11), counts, [1], 8)] == [
        [0, 1, 2, 6, 4, 3, 7, 10, 9, 5, 8]
    ]
    assert frequency_bands_of(torch.empty(0, dtype=torch.int64), counts, [1], 2) == []


def test_band_bounds_past_2_to_the_24_are_compared_exactly():
    """Training counts of a very frequent label pass 2**24, where a float32 bound would round (2**24 + 1 to 2**24):
    a label seen exactly as often as a bound is in that bound's band, one seen once more in the next."""
    bound = 2**24 + 1
    counts = torch.tensor([bound, bound + 1, 1, bound - 1], dtype=torch.int64)
    bands = frequency_bands_of(torch.arange(4), counts, [bound], group_size=1)
    assert [band.tolist() for band in bands] == [[2, 3, 0], [1]]
    bands = frequency_bands_of(torch.arange(4), counts.numpy(), [bound - 1, bound], group_size=1)
    assert [band.tolist() for band in bands] == [[2, 3], [0], [1]]


@pytest.mark.parametrize("strategy", ["semantic", "random", "frequency"])
@pytest.mark.parametrize("group_size", [1, 4, 16])
def test_every_strategy_groups_within_bands(strategy, group_size):
    embeddings, counts, _ = planted_tail(label_count=333)
    labels = torch.randperm(333, generator=torch.Generator().manual_seed(group_size))[:301]
    grouping = group_labels(
        embeddings, labels, group_size, strategy, label_frequencies=counts, frequency_bands=[1, 50], device="cpu"
    )
    assert_valid_grouping(grouping, labels, group_size)
    band_of = torch.full((333,), -1)
    for index, band in enumerate(frequency_bands_of(labels, counts, [1, 50], group_size)):
        band_of[band] = index
    groups = grouping.groups()
    for group in groups:
        members = group[group >= 0]
        assert band_of[members].unique().numel() == 1, group


def test_bad_bands_are_refused_by_name():
    counts = torch.tensor([1, 2, 3, 4])
    for bands in ([5, 1], [0, 3], [2, 2], [1.5]):
        with pytest.raises(ValueError, match="frequency_bands"):
            group_labels(None, [0, 1, 2], 2, "random", label_frequencies=counts, frequency_bands=bands)
    with pytest.raises(ValueError, match="label_frequencies"):
        group_labels(None, [0, 1, 2], 2, "random", frequency_bands=[1])


def test_a_layout_keeps_its_bands_in_its_file_and_refuses_others(tmp_path):
    counts = torch.tensor([50, 40, 1, 1, 1, 1, 3, 2, 9, 30])
    layout = LabelLayout.from_frequencies(
        counts, 2, head_label_count=2, strategy="random", frequency_bands=[1, 5], show_progress=False
    )
    assert layout.frequency_bands == (1, 5) and "bands up to [1, 5]" in layout.describe()
    assert {int(label) for label in layout.tail_order[:4]} == {2, 3, 4, 5}
    layout.save(tmp_path / "layout.safetensors")
    loaded = LabelLayout.load(tmp_path / "layout.safetensors")
    assert loaded.frequency_bands == (1, 5) and torch.equal(loaded.tail_order, layout.tail_order)
    loaded.check_options(frequency_bands=[1, 5])
    loaded.check_options()  # not given: the layout's
    with pytest.raises(ValueError, match="training-count bands"):
        loaded.check_options(frequency_bands=[1])
    plain = LabelLayout.from_frequencies(counts, 2, head_label_count=2, strategy="random", show_progress=False)
    plain.save(tmp_path / "plain.safetensors")
    assert LabelLayout.load(tmp_path / "plain.safetensors").frequency_bands == ()


def test_frequency_bands_through_the_command_line(dataset_dir, encoder_dir, tmp_path, capsys):
    """`haste-hf group` and `haste-hf train` take `--frequency-bands`: the saved layout and the trained model's groups
    lie within the bands of the training split's counts (`frequency_bands_of`)."""
    from haste_hf import HasteForExtremeClassification
    from haste_hf.cli import main
    from haste_hf.labels.layout import count_labels
    from haste_hf.recipe import load_dataset

    common = ["--data", str(dataset_dir), "--encoder", str(encoder_dir), "--group-size", "2", "--max-length", "16"]
    bands = ["--frequency-bands", "6", "8"]
    assert main(["group", *common, "--output", str(tmp_path / "layout"), *bands]) == 0, capsys.readouterr().err
    layout = LabelLayout.load(tmp_path / "layout")
    assert layout.frequency_bands == (6, 8)
    argv = ["train", *common, "--output-dir", str(tmp_path / "m"), "--fan-in", "8", "--max-steps", "1", *bands]
    assert main([*argv, "--use-cpu", "--report-to", "none"]) == 0, capsys.readouterr().err
    model = HasteForExtremeClassification.from_pretrained(tmp_path / "m")
    counts = torch.as_tensor(count_labels(load_dataset(str(dataset_dir), "auto", None, False).splits["train"], 30)[0])
    for tail_order in (layout.tail_order, model.output_layer.output_labels[layout.head_label_count :]):
        tail = tail_order[tail_order >= 0]
        band_of = torch.full((30,), -1)
        for index, band in enumerate(frequency_bands_of(tail, counts, [6, 8], 2)):
            band_of[band] = index
        assert band_of[tail].min() >= 0 and band_of[tail].unique().numel() > 1  # the planted counts span the bands
        for group in tail.view(-1, 2) if tail.numel() % 2 == 0 else tail[:-1].view(-1, 2):
            assert band_of[group].unique().numel() == 1, group
