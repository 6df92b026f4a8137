# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Synthetic extreme multi-label datasets with the label statistics of the paper's sets, in the Extreme
Classification Repository's raw-text format (`trn.json.gz`, `tst.json.gz`, `lbl.json.gz`), for `scale.py`.

    python benchmarks/scale_data.py --preset lf-paper2keywords-8.6m --out /tmp/p2k --test-points 20000
    python benchmarks/scale_data.py --preset amazon-670k --scale 0.05 --out /tmp/a670k-small

Statistics (the paper's table of datasets; `--scale s` multiplies the points and the labels by s, so labels
per point and points per label stay): train points N, labels L, test points N', mean labels per point.
Mean points per label follows as N x labels-per-point / L (3.99, 22.1 and 2.12; the paper's table prints
31.64 for Amazon-3M, which counts train and test points together). Every label has at least one training
point (a preset's `trained_labels`, where set, have one and the others none: 10^9 labels need not 10^9
positives); above that, a label's count follows a power law of its frequency rank r, 1 + floor(c x r^-a) (a:
`--exponent`, c fitted to the total), which gives a head of a few labels seen in 1-12% of the points and a
long tail seen once or twice. Label ids are a seeded bijection of the ranks (not sorted by frequency;
`RankPermutation`, computed for the trained ranks alone: no `[labels]` array at 10^9 labels).

Texts carry learnable traces of their labels: label l owns three pseudo-words, each of four syllables; the
first two syllables name l's topic (about 64 labels a topic), the last two l itself. A point's title holds
one word of each of its labels and about half as many noise words, shuffled; its content another word of
half its labels and twice as many noise words. A label's text (`lbl.json.gz`) is its three words. Points draw
their labels mostly from a few neighbouring topics (frequent labels from anywhere), so labels co-occur as in
real data and topics give semantic grouping something to find.

Fast and of bounded memory: the label assignment is vectorised numpy over all positives of a split (int32
arrays; Amazon-3M's 62M positives are the largest, about 2 GiB at peak); the JSON lines are built in
chunks of `CHUNK_POINTS` points by worker processes (fork), each chunk compressed (level 1: the writing, not the
ratio, is the cost) as its own gzip member (a concatenation of members is one valid gzip file) and written in
order; its header gives its size and line count (`haste_hf.gzip_members`), so that `haste-hf` parses the members
on every core and a rank reads only its share of the label texts. Seeded and deterministic: every
chunk draws from its own generator, so the files do not depend on `--processes`. `stats.json` records
the realised statistics and the chance levels of P@k (random labels, and the most frequent training
labels for every test point), which `scale.py` prints beside the model's.
"""

import argparse
import json
import math
import multiprocessing
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from haste_hf.gzip_members import indexed_member


@dataclass(frozen=True)
class Preset:
    train_points: int
    test_points: int
    labels: int
    labels_per_point: float
    points_per_label_in_paper: float
    # Labels with a training point (the most frequent ranks); the others have none (and no test point). None: all.
    trained_labels: int | None = None


# The paper's table of datasets (N, L, N', labels per point, points per label as printed).
PRESETS = {
    "amazon-670k": Preset(490_449, 153_025, 670_091, 5.45, 3.99),
    "amazon-3m": Preset(1_717_899, 742_507, 2_812_281, 36.17, 31.64),
    "lf-paper2keywords-8.6m": Preset(2_020_621, 2_020_621, 8_623_847, 9.03, 2.12),
    # Not in the paper: 10^8 labels in as few points as a 10-minute GPU run can write, read and train (issue 37
    # item 3). Every label has a training point, so the positives are at least the labels: 4M points of 27.5 labels
    # (110M positives: 10M above one a label make the power-law head). Titles of 41 words fill 128 tokens.
    "synthetic-100m": Preset(4_000_000, 4_000_000, 100_000_000, 27.5, 1.1),
    # Not in the paper: 10^9 labels (issue 42 item 2) in the points of synthetic-100m; 10^8 of them have training
    # points (the same 110M positives), the other 9 x 10^8 exist (a label text, an output row) and are never seen.
    "synthetic-1b": Preset(4_000_000, 4_000_000, 1_000_000_000, 27.5, 0.11, trained_labels=100_000_000),
}

CONSONANTS, VOWELS = b"bcdfghjklmnprstvwxyz", b"aeiou"
# 100 two-letter syllables; every word is four of them (8 letters).
SYLLABLES = np.array([[c, v] for c in CONSONANTS for v in VOWELS], dtype=np.uint8)
SYLLABLES_PER_WORD = 4
WORD_BYTES = 2 * SYLLABLES_PER_WORD + 1  # with the space after it
WORDS_PER_LABEL = 3
LABELS_PER_TOPIC = 64
# A label's positives stay within its topic's neighbourhood with probability min(1, TOPICAL_COUNT / count):
# rare labels always, frequent ones mostly spread over all points (they would repeat inside a point otherwise).
TOPICAL_COUNT = 16
TOPIC_SPREAD = 2.0  # a point's positives come from about this many neighbouring topics
CHUNK_POINTS = 32768
REDEALS = 3  # rounds that move a label drawn twice for a point elsewhere
SPLIT_SEEDS = {"train": 1, "test": 2, "labels": 3}
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def scaled(preset: Preset, scale: float, test_points: int | None) -> dict:
    labels = max(1, round(preset.labels * scale))
    trained = labels if preset.trained_labels is None else min(labels, max(1, round(preset.trained_labels * scale)))
    train = max(1, round(preset.train_points * scale))
    positives = max(trained, round(train * preset.labels_per_point))
    test = test_points if test_points is not None else max(1, round(preset.test_points * scale))
    return dict(labels=labels, trained_labels=trained, train_points=train, test_points=test, train_positives=positives)


def label_counts(labels: int, positives: int, points: int, exponent: float) -> np.ndarray:
    """Training count of each frequency rank (int64 `[labels]`, descending): 1 + floor(c x r^-a), at most
    `points`, with c fitted so that the counts sum to `positives` (the remainder goes to the top ranks)."""
    weights = np.arange(1, labels + 1, dtype=np.float64) ** -exponent
    extra = positives - labels
    # sum(floor(c x w)) lies in (c x sum(w) - labels, c x sum(w)]: c is within labels / sum(w) of extra / sum(w).
    weight_sum = float(weights.sum())
    low, high = extra / weight_sum, (extra + labels) / weight_sum
    # Below `high`, floor(c x w) is 0 past the rank where high x w < 1: the bisection sums the ranks before it (10^8
    # trained labels: a few million, not 40 passes over all).
    reach = int(np.searchsorted(-weights, -(1 - 1e-9) / high, side="right")) if high > 0 else 0  # a margin for rounding
    reached = weights[:reach]

    def total(c):
        return int(np.minimum(np.floor(c * reached), points - 1).sum())

    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if total(middle) <= extra else (low, middle)
    counts = 1 + np.minimum(np.floor(low * weights), points - 1).astype(np.int64)
    remainder = positives - int(counts.sum())
    room = points - counts
    for rank in range(labels):  # a handful of ranks: the floor loses less than one per label
        if remainder <= 0:
            break
        added = min(remainder, int(room[rank]))
        counts[rank] += added
        remainder -= added
    return counts


def _mix(values: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash, elementwise (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = values.astype(np.uint64) * _GOLDEN
        x ^= x >> np.uint64(29)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(32)
    return x


FEISTEL_ROUNDS = 4


class RankPermutation:
    """The label id of each frequency rank: a seeded bijection of `[0, labels)` (a Feistel network on the bits of an
    id, cycle-walked into the range), computed for the ranks asked for in either direction, so that no `[labels]`
    array is drawn, scattered or gathered (10^9 labels: minutes of one core, 8 GB each)."""

    def __init__(self, labels: int, seed: int):
        self.labels = labels
        self.half_bits = max(1, ((labels - 1).bit_length() + 1) // 2)
        self.keys = [
            _mix(np.array([seed * FEISTEL_ROUNDS + round_ + (7 << 50)]))[0] for round_ in range(FEISTEL_ROUNDS)
        ]

    def _rounds(self, values: np.ndarray, inverse: bool) -> np.ndarray:
        bits, mask = np.uint64(self.half_bits), np.uint64((1 << self.half_bits) - 1)
        left, right = values >> bits, values & mask
        for key in reversed(self.keys) if inverse else self.keys:
            if inverse:
                left, right = right ^ (_mix(left ^ key) & mask), left
            else:
                left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << bits) | right

    def _walk(self, values, inverse: bool) -> np.ndarray:
        result = self._rounds(np.asarray(values, dtype=np.uint64), inverse)
        outside = np.flatnonzero(result >= np.uint64(self.labels))
        while outside.size:  # cycle walking: the network's domain is up to 4x the range
            result[outside] = self._rounds(result[outside], inverse)
            outside = outside[result[outside] >= np.uint64(self.labels)]
        return result.astype(np.int64)

    def label_of(self, ranks) -> np.ndarray:
        return self._walk(ranks, inverse=False)

    def rank_of(self, labels) -> np.ndarray:
        return self._walk(labels, inverse=True)


def topic_of(label_ids: np.ndarray, topic_count: int) -> np.ndarray:
    return (_mix(label_ids) % np.uint64(topic_count)).astype(np.int64)


def label_word_syllables(label_ids: np.ndarray, word_index: np.ndarray, topic_count: int) -> np.ndarray:
    """`[n, 4]` syllable ids of word `word_index` of each label: two naming the topic, two the label."""
    topic = topic_of(label_ids, topic_count)
    own = _mix(label_ids.astype(np.int64) * WORDS_PER_LABEL + word_index + 1).astype(np.int64) & 0xFFFFFF
    topic_code = _mix(topic + (1 << 40)).astype(np.int64) & 0xFFFFFF
    return np.stack([topic_code % 100, topic_code // 100 % 100, own % 100, own // 100 % 100], axis=1)


def assign_points(
    occurrences: np.ndarray, occurrence_counts: np.ndarray, label_count: int, points: int, topic_count: int, rng
) -> tuple:
    """Deals the label occurrences (label ids, one per positive; `occurrence_counts`: the training count of each
    one's label) out to `points` points: ordered by a key that keeps rare labels near their topic, cut at random
    places (every point gets at least one); a label drawn twice for a point moves to a random point (dropped after
    `REDEALS` rounds). Returns `(offsets [points + 1], labels)`, int64 / int32, each point's labels sorted."""
    total = occurrences.size
    topical = rng.random(total) * occurrence_counts < TOPICAL_COUNT
    key = np.where(
        topical,
        topic_of(occurrences, topic_count) + rng.random(total) * TOPIC_SPREAD,
        rng.random(total) * topic_count,
    )
    occurrences = occurrences[np.argsort(key)]
    del key, topical, occurrence_counts
    cuts = np.sort(rng.choice(total - 1, size=points - 1, replace=False) + 1) if points > 1 else np.empty(0, np.int64)
    sizes = np.diff(np.concatenate([[0], cuts, [total]]))
    owner = np.repeat(np.arange(points, dtype=np.int64), sizes)
    pairs = np.sort(owner * label_count + occurrences)  # a point's labels together, ascending
    del owner, occurrences
    for round_ in range(REDEALS + 1):
        repeated = np.zeros(pairs.size, dtype=bool)
        repeated[1:] = pairs[1:] == pairs[:-1]
        if not repeated.any():
            break
        # A label drawn twice for one point goes to a random point instead (the last round drops it).
        moved = pairs[repeated] % label_count
        pairs = pairs[~repeated]
        if round_ < REDEALS:
            pairs = np.sort(np.concatenate([pairs, rng.integers(0, points, moved.size) * label_count + moved]))
    owner, labels = np.divmod(pairs, label_count)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=points))])
    return offsets, labels.astype(np.int32)


# ------------------------------------------------------------------------------------------------ text

# Set by the parent before the workers fork; read by them (copy-on-write).
_SHARED: dict = {}


def _join_words(owner: np.ndarray, syllables: np.ndarray, num_points: int, rng) -> list[bytes]:
    """Each point's words (`owner[i]` is the point of word i), shuffled, joined by spaces."""
    order = np.argsort(owner + rng.random(owner.size), kind="stable")
    rows = np.empty((owner.size, WORD_BYTES), dtype=np.uint8)
    rows[:, :-1] = SYLLABLES[syllables[order]].reshape(owner.size, -1)
    rows[:, -1] = ord(" ")
    buffer = rows.tobytes()
    ends = np.cumsum(np.bincount(owner, minlength=num_points)) * WORD_BYTES
    starts = np.concatenate([[0], ends[:-1]])
    return [buffer[start : end - 1] for start, end in zip(starts.tolist(), ends.tolist())]


def _noise(counts: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    owner = np.repeat(np.arange(counts.size), counts)
    return owner, rng.integers(0, len(SYLLABLES), size=(owner.size, SYLLABLES_PER_WORD))


def _point_lines(split: str, chunk: int) -> bytes:
    offsets, labels, topic_count, seed = (
        _SHARED[name] for name in ("offsets_" + split, "labels_" + split, "topics", "seed")
    )
    first, last = chunk * CHUNK_POINTS, min((chunk + 1) * CHUNK_POINTS, offsets.size - 1)
    rng = np.random.default_rng([seed, SPLIT_SEEDS[split], chunk])
    begin, end = offsets[first], offsets[last]
    chunk_labels = labels[begin:end].astype(np.int64)
    sizes = np.diff(offsets[first : last + 1])
    num_points = sizes.size
    owner = np.repeat(np.arange(num_points), sizes)

    title_word = rng.integers(0, WORDS_PER_LABEL, size=owner.size)
    title_owner, title_noise = _noise(sizes // 2 + 1, rng)
    titles = _join_words(
        np.concatenate([owner, title_owner]),
        np.concatenate([label_word_syllables(chunk_labels, title_word, topic_count), title_noise]),
        num_points,
        rng,
    )
    in_content = rng.random(owner.size) < 0.5
    content_word = (title_word + rng.integers(1, WORDS_PER_LABEL, size=owner.size)) % WORDS_PER_LABEL
    content_owner, content_noise = _noise(2 * sizes + 1, rng)
    contents = _join_words(
        np.concatenate([owner[in_content], content_owner]),
        np.concatenate(
            [label_word_syllables(chunk_labels[in_content], content_word[in_content], topic_count), content_noise]
        ),
        num_points,
        rng,
    )
    ids = chunk_labels.tolist()
    bounds = (offsets[first : last + 1] - begin).tolist()
    prefix = b"trn" if split == "train" else b"tst"
    lines = [
        b'{"uid":"%s-%d","title":"%s","content":"%s","target_ind":[%s]}\n'
        % (
            prefix,
            first + row,
            titles[row],
            contents[row],
            ",".join(map(str, ids[bounds[row] : bounds[row + 1]])).encode(),
        )
        for row in range(num_points)
    ]
    return indexed_member(b"".join(lines), num_points)


def _label_lines(chunk: int) -> bytes:
    label_count, topic_count = _SHARED["label_count"], _SHARED["topics"]
    first, last = chunk * CHUNK_POINTS, min((chunk + 1) * CHUNK_POINTS, label_count)
    ids = np.arange(first, last, dtype=np.int64)
    owner = np.repeat(np.arange(ids.size), WORDS_PER_LABEL)
    words = np.tile(np.arange(WORDS_PER_LABEL), ids.size)
    syllables = label_word_syllables(ids[owner], words, topic_count)
    rows = np.empty((owner.size, WORD_BYTES), dtype=np.uint8)
    rows[:, :-1] = SYLLABLES[syllables].reshape(owner.size, -1)
    rows[:, -1] = ord(" ")
    buffer, width = rows.tobytes(), WORDS_PER_LABEL * WORD_BYTES
    lines = [
        b'{"uid":"lbl-%d","title":"%s"}\n' % (first + row, buffer[row * width : (row + 1) * width - 1])
        for row in range(ids.size)
    ]
    return indexed_member(b"".join(lines), ids.size)


def _run_task(task):
    kind, chunk = task
    return _label_lines(chunk) if kind == "labels" else _point_lines(kind, chunk)


def _write(path: Path, kind: str, chunk_count: int, pool) -> None:
    staging = path.with_name(path.name + ".partial")
    with open(staging, "wb") as handle:
        tasks = [(kind, chunk) for chunk in range(chunk_count)]
        results = pool.imap(_run_task, tasks) if pool is not None else map(_run_task, tasks)
        for member in results:
            handle.write(member)
    os.replace(staging, path)


# ------------------------------------------------------------------------------------------------ chance levels


def chance_levels(test_offsets: np.ndarray, ranks: np.ndarray, label_count: int, ks=(1, 3, 5)):
    """P@k of two predictors that ignore the text: k labels drawn at random (expected value), and the k most
    frequent training labels for every point (`ranks`: the frequency rank of each test positive)."""
    sizes = np.diff(test_offsets)
    owner = np.repeat(np.arange(sizes.size), sizes)
    levels = {}
    for k in ks:
        hits = np.bincount(owner[ranks < k], minlength=sizes.size)
        levels[f"random P@{k}"] = float(sizes.mean() / label_count)
        levels[f"most frequent P@{k}"] = float(hits.sum() / (k * sizes.size))
    return levels


# ------------------------------------------------------------------------------------------------ main


def generate(
    out: str | os.PathLike,
    preset: str,
    scale: float = 1.0,
    test_points: int | None = None,
    seed: int = 0,
    exponent: float = 0.7,
    processes: int | None = None,
) -> dict:
    """Writes the dataset into `out` and returns its statistics (also written to `out/stats.json`)."""
    started = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = scaled(PRESETS[preset], scale, test_points)
    label_count = sizes["labels"]
    topic_count = max(1, label_count // LABELS_PER_TOPIC)
    trained = sizes["trained_labels"]  # the most frequent ranks; the others have no training point
    counts_by_rank = label_counts(trained, sizes["train_positives"], sizes["train_points"], exponent)
    permutation = RankPermutation(label_count, seed)
    occurrences = np.repeat(permutation.label_of(np.arange(trained)).astype(np.int32), counts_by_rank)
    train = assign_points(
        occurrences, np.repeat(counts_by_rank, counts_by_rank), label_count, sizes["train_points"], topic_count,
        np.random.default_rng([seed, 1]),
    )  # fmt: skip
    del occurrences
    test_rng = np.random.default_rng([seed, 2])
    test_positives = max(
        sizes["test_points"], round(sizes["test_points"] * sizes["train_positives"] / sizes["train_points"])
    )
    cumulative = np.cumsum(counts_by_rank)
    drawn = np.searchsorted(cumulative, test_rng.integers(0, cumulative[-1], size=test_positives), side="right")
    test = assign_points(
        permutation.label_of(drawn).astype(np.int32), counts_by_rank[drawn], label_count, sizes["test_points"],
        topic_count, test_rng,
    )  # fmt: skip
    del drawn
    assigned = time.time() - started

    _SHARED.update(
        offsets_train=train[0], labels_train=train[1], offsets_test=test[0], labels_test=test[1],
        topics=topic_count, seed=seed, label_count=label_count,
    )  # fmt: skip
    processes = processes or os.cpu_count() or 1
    context = multiprocessing.get_context("fork")
    pool = context.Pool(processes) if processes > 1 else None
    try:
        _write(out / "lbl.json.gz", "labels", math.ceil(label_count / CHUNK_POINTS), pool)
        for split, name in (("train", "trn.json.gz"), ("test", "tst.json.gz")):
            offsets = _SHARED["offsets_" + split]
            _write(out / name, split, math.ceil((offsets.size - 1) / CHUNK_POINTS), pool)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _SHARED.clear()

    train_counts = np.bincount(train[1], minlength=label_count)
    stats = {
        "preset": preset,
        "scale": scale,
        "seed": seed,
        "exponent": exponent,
        "paper": asdict(PRESETS[preset]),
        "labels": label_count,
        "topics": topic_count,
        "train_points": int(train[0].size - 1),
        "test_points": int(test[0].size - 1),
        "train_positives": int(train[1].size),
        "labels_per_train_point": float(train[1].size / (train[0].size - 1)),
        "points_per_label": float(train[1].size / label_count),
        "labels_per_test_point": float(test[1].size / (test[0].size - 1)),
        "max_label_count": int(train_counts.max()),
        "head_share_of_points": float(train_counts.max() / (train[0].size - 1)),
        "labels_seen_once": int((train_counts == 1).sum()),
        "labels_without_training_point": int((train_counts == 0).sum()),
        "chance": chance_levels(test[0], permutation.rank_of(test[1]), label_count),
        "seconds": {"assignment": round(assigned, 2), "total": round(time.time() - started, 2)},
        "processes": processes,
        "bytes": {name: (out / name).stat().st_size for name in ("trn.json.gz", "tst.json.gz", "lbl.json.gz")},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2))
    return stats


def tiny_encoder(folder: Path) -> str:
    """A 2-layer BERT of width 128 whose WordPiece vocabulary is `SYLLABLES` (a word of the texts is four pieces):
    CPU runs learn from it what MiniLM would learn from the same words."""
    from transformers import BertConfig, BertModel, BertTokenizer

    syllables = [bytes(pair).decode() for pair in SYLLABLES.tolist()]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *syllables, *("##" + s for s in syllables)]
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=512,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", required=True, help="Folder to write trn.json.gz, tst.json.gz, lbl.json.gz into.")
    parser.add_argument("--scale", type=float, default=1.0, help="Multiplies the points and the labels (default 1).")
    parser.add_argument("--test-points", type=int, default=None, help="Test points (default: the preset's, scaled).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exponent", type=float, default=0.7, help="Power law of a label's count by its rank.")
    parser.add_argument("--processes", type=int, default=None, help="Writer processes (default: every core).")
    args = parser.parse_args(argv)
    if not 0 < args.scale <= 1:
        parser.error(f"--scale must lie in (0, 1], got {args.scale}")
    if args.test_points is not None and args.test_points < 1:
        parser.error(f"--test-points must be >= 1, got {args.test_points}")
    stats = generate(args.out, args.preset, args.scale, args.test_points, args.seed, args.exponent, args.processes)
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
