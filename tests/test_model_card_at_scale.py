# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The model card's label-frequency plot at millions of labels (issue 28): log-spaced ranks, not every label."""

import numpy as np
from tiny_haste import make_tiny_model

from haste_hf.model_card import PLOTTED_RANKS, HasteModelCardData, write_model_card


def test_frequency_plot_of_a_million_labels_draws_log_spaced_ranks(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    loglog = matplotlib.axes.Axes.loglog

    def record(axes, x, y, *args, **kwargs):
        drawn.append((np.asarray(x), np.asarray(y)))
        return loglog(axes, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "loglog", record)
    frequencies = np.random.default_rng(0).zipf(1.7, 1_000_000)
    frequencies[:5] = 0  # not drawn on log axes
    data = HasteModelCardData.from_model(
        make_tiny_model(label_count=300, head_label_count=9),
        model_id="someone/haste-big",
        dataset_name="big",
        label_frequencies=frequencies,
    )
    write_model_card(data, tmp_path / "README.md")
    (ranks, counts), *_ = drawn
    seen = np.sort(frequencies[frequencies > 0])[::-1]
    assert len(ranks) <= PLOTTED_RANKS
    assert ranks[0] == 1 and ranks[-1] == len(seen) and np.all(np.diff(ranks) > 0)
    np.testing.assert_array_equal(counts, seen[ranks - 1])
