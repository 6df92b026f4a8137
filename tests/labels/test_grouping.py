import math

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tiny_encoders import VOCAB_SIZE, tiny_encoder_config
from transformers import BertModel, BertTokenizerFast

from haste_hf.labels.embeddings import compute_label_embeddings
from haste_hf.labels.grouping import (
    LabelGrouping,
    _greedy_groups,
    _spherical_kmeans,
    group_labels,
    grouping_objective,
)
from haste_hf.labels.layout import split_head_tail
from haste_hf.modeling.modeling_haste import pool_hidden_states


WORDS = [f"w{i}" for i in range(VOCAB_SIZE - 5)]


def clustered_embeddings(label_count, dim, num_topics, noise, seed=0):
    generator = torch.Generator().manual_seed(seed)
    topics = F.normalize(torch.randn(num_topics, dim, generator=generator), dim=1)
    topic = torch.randint(num_topics, (label_count,), generator=generator)
    return F.normalize(topics[topic] + noise / dim**0.5 * torch.randn(label_count, dim, generator=generator), dim=1)


def assert_valid_grouping(grouping, label_ids, group_size):
    assert grouping.order.dtype == torch.int64
    assert torch.equal(torch.sort(grouping.order).values, torch.sort(torch.as_tensor(label_ids)).values)
    groups = grouping.groups()
    assert groups.dtype == torch.int64  # label ids past 2^31 (10^9 labels and more) stay exact
    assert groups.shape == (math.ceil(len(label_ids) / group_size), group_size)
    filled = (groups >= 0).sum(dim=1)
    assert bool((filled[:-1] == group_size).all())
    assert groups.reshape(-1)[: len(label_ids)].tolist() == grouping.order.tolist()


# ---------------------------------------------------------------------------------------------------------
# split_head_tail
# ---------------------------------------------------------------------------------------------------------


def test_split_head_tail_takes_most_frequent_with_stable_ties():
    counts = [5, 9, 1, 9, 0, 5, 3]
    head, tail = split_head_tail(counts, head_label_count=3)
    assert head.dtype == np.int64 and tail.dtype == np.int64
    assert head.tolist() == [1, 3, 0]
    assert tail.tolist() == [5, 6, 2, 4]


@pytest.mark.parametrize("fraction, expected", [(0.0, 0), (0.25, 2), (0.3, 2), (0.36, 3), (1.0, 7)])
def test_split_head_tail_fraction_rounds_to_nearest(fraction, expected):
    head, tail = split_head_tail(torch.tensor([7, 6, 5, 4, 3, 2, 1]), head_label_fraction=fraction)
    assert head.tolist() == list(range(expected))
    assert tail.tolist() == list(range(expected, 7))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one"),
        ({"head_label_fraction": 0.1, "head_label_count": 1}, "exactly one"),
        ({"head_label_fraction": 1.5}, "head_label_fraction"),
        ({"head_label_fraction": -0.1}, "head_label_fraction"),
        ({"head_label_count": 5}, "head_label_count"),
        ({"head_label_count": -1}, "head_label_count"),
        ({"head_label_count": 1.0}, "head_label_count"),
    ],
)
def test_split_head_tail_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        split_head_tail([3, 2, 1, 0], **kwargs)


@pytest.mark.parametrize("counts", [[[1, 2]], [1, -2], [1.0, float("nan")]])
def test_split_head_tail_rejects_bad_counts(counts):
    with pytest.raises(ValueError, match="label_frequencies"):
        split_head_tail(counts, head_label_count=1)


# ---------------------------------------------------------------------------------------------------------
# compute_label_embeddings
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    vocab_file = tmp_path_factory.mktemp("tokenizer") / "vocab.txt"
    vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    torch.manual_seed(0)
    return BertModel(tiny_encoder_config("bert"), add_pooling_layer=False).eval(), BertTokenizerFast(
        vocab_file=str(vocab_file)
    )


def random_corpus(num_texts, label_count, seed=0):
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(num_texts)]
    labels = [rng.choice(label_count, size=rng.integers(0, 4), replace=False).tolist() for _ in range(num_texts)]
    return texts, labels


def naive_label_embeddings(embed_one, texts, labels, label_count):
    """One text and one label at a time, in float64."""
    instance = [F.normalize(embed_one(text).double(), dim=0) for text in texts]
    out = []
    for label in range(label_count):
        positives = [instance[i] for i, ids in enumerate(labels) if label in ids]
        if not positives:
            out.append(torch.zeros_like(instance[0]))
        else:
            out.append(F.normalize(torch.stack(positives).mean(dim=0), dim=0))
    return torch.stack(out)


@pytest.mark.parametrize("pooling", ["cls", "mean", "last_token"])
def test_label_embeddings_match_naive_loop_with_hf_encoder(tiny_bert, pooling):
    model, tokenizer = tiny_bert
    texts, labels = random_corpus(23, 9)
    labels[0] = [0, 8]

    def embed_one(text):  # unpadded: checks that padding and masks do not leak into the pooled vector
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        return {"cls": hidden[0], "mean": hidden.mean(dim=0), "last_token": hidden[-1]}[pooling]

    expected = naive_label_embeddings(embed_one, texts, labels, 9)
    model.train()
    embeddings = compute_label_embeddings(
        model, texts, labels, 9, tokenizer=tokenizer, batch_size=5, pooling=pooling, device="cpu", show_progress=False
    )
    assert model.training  # training mode restored
    model.eval()
    assert embeddings.dtype == torch.float32 and embeddings.shape == (9, model.config.hidden_size)
    torch.testing.assert_close(embeddings.double(), expected, atol=1e-5, rtol=1e-5)


def test_label_embeddings_pool_as_the_model_does_by_default(tiny_bert):
    from haste_hf.modeling.configuration_haste import default_pooling

    model, tokenizer = tiny_bert
    texts, labels = random_corpus(23, 9)
    kwargs = dict(tokenizer=tokenizer, batch_size=5, device="cpu", show_progress=False)
    by_default = compute_label_embeddings(model, texts, labels, 9, **kwargs)
    assert default_pooling(model.config) == "mean"
    torch.testing.assert_close(by_default, compute_label_embeddings(model, texts, labels, 9, pooling="mean", **kwargs))
    assert not torch.allclose(by_default, compute_label_embeddings(model, texts, labels, 9, pooling="cls", **kwargs))


def test_label_embeddings_progress_moves_a_batch_at_a_time(tiny_bert, monkeypatch):
    """The bar advances with each encoder batch, not once a chunk of 16,384 texts: the demo's 2,700 texts are one
    chunk, minutes on a loaded CPU, and its bar stood at 0 until the end."""
    from haste_hf.labels import embeddings

    updates = []

    class Recorder(embeddings.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(embeddings, "tqdm", Recorder)
    model, tokenizer = tiny_bert
    texts, labels = random_corpus(23, 9)
    compute_label_embeddings(model, texts, labels, 9, tokenizer=tokenizer, batch_size=2, device="cpu")
    assert len(updates) > 1 and sum(updates) == 23


def test_pooling_beside_an_encoder_that_embeds_texts_itself_is_named_in_a_warning():
    from transformers.testing_utils import CaptureLogger

    from haste_hf.labels import embeddings

    with CaptureLogger(embeddings.logger) as captured:
        compute_label_embeddings(lambda texts: torch.ones(len(texts), 3), ["a"], [[0]], 2, pooling="cls", device="cpu")
    assert "`pooling='cls'` is ignored" in captured.out


def test_semantic_grouping_of_labels_without_any_positive_keeps_their_order():
    """A small training split may leave every tail label without a positive (all-zero embeddings)."""
    label_ids = torch.tensor([7, 3, 5, 1, 9])
    grouping = group_labels(torch.zeros(10, 4), label_ids, 2, "semantic", device="cpu", show_progress=False)
    assert grouping.order.tolist() == label_ids.tolist()


def test_pooling_follows_the_attention_mask_on_either_padding_side():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    torch.testing.assert_close(pool_hidden_states(hidden, right, "cls"), hidden[:, 0])
    torch.testing.assert_close(
        pool_hidden_states(hidden, right, "mean"), torch.stack([hidden[0, :2].mean(0), hidden[1].mean(0)])
    )
    torch.testing.assert_close(
        pool_hidden_states(hidden, left, "mean"), torch.stack([hidden[0, 2:].mean(0), hidden[1].mean(0)])
    )
    torch.testing.assert_close(
        pool_hidden_states(hidden, right, "last_token"), torch.stack([hidden[0, 1], hidden[1, 3]])
    )
    torch.testing.assert_close(pool_hidden_states(hidden, left, "last_token"), hidden[:, 3])


def test_label_embeddings_with_callable_and_sentence_transformers_style_encoder():
    generator = torch.Generator().manual_seed(0)
    table = {word: torch.randn(6, generator=generator) for word in WORDS}

    def embed_one(text):
        return sum(table[word] for word in text.split())

    class EncodeModel:  # the sentence-transformers interface, duck-typed
        def encode(self, texts, batch_size, convert_to_tensor, show_progress_bar):
            assert batch_size == len(texts) and convert_to_tensor and not show_progress_bar
            return torch.stack([embed_one(text) for text in texts])

    texts, labels = random_corpus(31, 12, seed=1)
    labels[3] = np.array(labels[3], dtype=np.int32)  # array-like label lists are accepted
    expected = naive_label_embeddings(embed_one, texts, labels, 12)
    assert bool((expected.norm(dim=1) == 0).any())  # some label has no positive: zero vector
    from_callable = compute_label_embeddings(
        lambda batch: np.stack([embed_one(t).numpy() for t in batch]),
        iter(texts),  # a plain iterator: streamed without len()
        iter(labels),
        12,
        batch_size=4,
        device="cpu",
        show_progress=False,
    )
    from_encode = compute_label_embeddings(EncodeModel(), texts, labels, 12, batch_size=7, device="cpu")
    dataset = datasets.Dataset.from_dict({"text": texts, "labels": [list(map(int, ids)) for ids in labels]})
    from_dataset = compute_label_embeddings(
        EncodeModel(), dataset["text"], dataset["labels"], 12, batch_size=8, device="cpu", show_progress=False
    )
    torch.testing.assert_close(from_callable.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_encode.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_dataset.double(), expected, atol=1e-5, rtol=1e-5)


def test_label_embeddings_reject_bad_input(tiny_bert):
    model, _tokenizer = tiny_bert

    def encode(batch):
        return torch.ones(len(batch), 4)

    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        compute_label_embeddings(encode, ["a", "b"], [[0], [-100]], 3, device="cpu", show_progress=False)
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        compute_label_embeddings(encode, ["a"], [[3]], 3, device="cpu", show_progress=False)
    with pytest.raises(ValueError):
        compute_label_embeddings(encode, ["a", "b"], [[0]], 3, device="cpu", show_progress=False)
    with pytest.raises(ValueError, match="one embedding per text"):
        compute_label_embeddings(lambda b: torch.ones(4), ["a"], [[0]], 3, device="cpu", show_progress=False)
    with pytest.raises(ValueError, match="tokenizer"):
        compute_label_embeddings(model, ["w1"], [[0]], 3, device="cpu")
    with pytest.raises(ValueError, match="pooling"):
        compute_label_embeddings(encode, ["a"], [[0]], 3, pooling="max")
    with pytest.raises(TypeError, match="encoder"):
        compute_label_embeddings(42, ["a"], [[0]], 3, device="cpu")
    with pytest.raises(ValueError, match="empty"):
        compute_label_embeddings(encode, [], [], 3, device="cpu", show_progress=False)


# ---------------------------------------------------------------------------------------------------------
# group_labels
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["semantic", "frequency", "random"])
@pytest.mark.parametrize(
    "label_count, group_size, beta",
    [(1, 4, 16), (3, 4, 16), (4, 4, 1), (37, 4, 1), (1000, 8, 2), (2501, 16, 16), (700, 1, 4), (50, 64, 16)],
)
def test_groups_are_full_and_cover_the_labels(strategy, label_count, group_size, beta):
    embeddings = clustered_embeddings(3000, 12, 40, 1.0)
    label_ids = torch.randperm(3000, generator=torch.Generator().manual_seed(label_count))[:label_count]
    counts = torch.randint(100, (3000,), generator=torch.Generator().manual_seed(1))
    grouping = group_labels(
        embeddings, label_ids, group_size, strategy, label_frequencies=counts, beta=beta, device="cpu", seed=3
    )
    assert grouping.group_size == group_size and grouping.strategy == strategy
    assert_valid_grouping(grouping, label_ids, group_size)


def test_semantic_beats_random_on_planted_clusters():
    embeddings = clustered_embeddings(6000, 32, 6000 // 32, 1.0)
    label_ids = torch.arange(100, 6000)  # the first 100 labels are the head
    semantic = group_labels(embeddings, label_ids, 16, beta=4, device="cpu")
    random = group_labels(None, label_ids, 16, "random")
    semantic_score = grouping_objective(embeddings, semantic, device="cpu")
    random_score = grouping_objective(embeddings, random, device="cpu")
    # A group drawn from one planted topic scores ~0.73 here, a random group ~0.25.
    assert semantic_score > 0.65
    assert random_score < 0.3
    assert_valid_grouping(semantic, label_ids, 16)


@pytest.mark.parametrize("beta", [2, 4, 16])
def test_semantic_grouping_recovers_planted_groups(beta):
    # 40 tight, well separated topics of exactly 8 labels each. A random grouping has no group inside one
    # topic; semantic groups mostly are (a k-means boundary may still cut a topic, and the cut pieces pull
    # neighbours into mixed groups).
    generator = torch.Generator().manual_seed(0)
    topics = F.normalize(torch.randn(40, 64, generator=generator), dim=1)
    topic_of_label = torch.randperm(320, generator=generator) % 40
    embeddings = F.normalize(topics[topic_of_label] + 0.02 * torch.randn(320, 64, generator=generator), dim=1)
    grouping = group_labels(embeddings, torch.arange(320), 8, beta=beta, device="cpu")
    pure = sum(topic_of_label[group].unique().numel() == 1 for group in grouping.groups())
    assert pure >= 32


def test_semantic_grouping_is_deterministic_for_a_seed():
    embeddings = clustered_embeddings(2000, 16, 50, 2.0)
    first = group_labels(embeddings, torch.arange(2000), 8, beta=4, seed=7, device="cpu")
    again = group_labels(embeddings.numpy(), np.arange(2000), 8, beta=4, seed=7, device="cpu")
    other = group_labels(embeddings, torch.arange(2000), 8, beta=4, seed=8, device="cpu")
    assert torch.equal(first.order, again.order)
    assert not torch.equal(first.order, other.order)


def test_labels_without_embedding_come_last():
    embeddings = clustered_embeddings(100, 8, 5, 0.5)
    embeddings[[3, 50, 97]] = 0
    label_ids = torch.arange(10, 100)
    grouping = group_labels(embeddings, label_ids, 4, beta=2, device="cpu")
    assert grouping.order[-2:].tolist() == [50, 97]
    assert_valid_grouping(grouping, label_ids, 4)


def test_large_buckets_are_split_and_identical_embeddings_terminate():
    # All-identical embeddings put every label into one k-means bucket, far above the size cap.
    embeddings = torch.ones(5000, 8)
    grouping = group_labels(embeddings, torch.arange(5000), 4, beta=2, device="cpu")
    assert_valid_grouping(grouping, torch.arange(5000), 4)


@pytest.mark.parametrize("sizes", [[4], [4, 5, 3, 8], [3, 4]])
def test_greedy_groups_of_buckets_of_exactly_g_labels(sizes):
    """A bucket of exactly G rows is one group; every row ends in a group or in the leftover, once."""
    x = clustered_embeddings(sum(sizes), 6, 3, 1.0)
    bucket = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    groups, leftover = _greedy_groups(x, bucket, 4, torch.Generator().manual_seed(0))
    assert groups.shape == (sum(size // 4 for size in sizes), 4)
    assert sorted(groups.reshape(-1).tolist() + leftover.tolist()) == list(range(sum(sizes)))
    assert all(bucket[group].unique().numel() == 1 for group in groups)
    assert sorted(bucket[leftover].tolist()) == sorted(b for b, size in enumerate(sizes) for _ in range(size % 4))


@pytest.mark.parametrize("seed", range(10))
def test_kmeans_keeps_every_cluster_in_use(seed):
    """Starting rows that coincide (labels of the same name embed alike) leave clusters empty; they restart
    where the rows fit their centroids worst, so that all five are in use."""
    generator = torch.Generator().manual_seed(0)
    directions = torch.eye(8)
    rows = [directions[0].expand(60, 8)] + [
        directions[j] + 0.05 * torch.randn(10, 8, generator=generator) for j in range(1, 5)
    ]
    x = F.normalize(torch.cat(rows), dim=1)
    cluster = _spherical_kmeans(x, 5, 10, torch.Generator().manual_seed(seed))
    assert cluster.unique().numel() == 5


def test_frequency_and_random_strategies():
    counts = torch.tensor([5, 1, 7, 1, 9, 0, 7])
    grouping = group_labels(None, [1, 2, 3, 5, 6], 2, "frequency", label_frequencies=counts)
    assert grouping.order.tolist() == [2, 6, 1, 3, 5]
    first = group_labels(None, torch.arange(50), 8, "random", seed=1)
    assert torch.equal(first.order, group_labels(None, torch.arange(50), 8, "random", seed=1).order)
    assert not torch.equal(first.order, torch.arange(50))
    assert_valid_grouping(first, torch.arange(50), 8)


def test_group_labels_rejects_bad_arguments():
    embeddings = torch.randn(10, 4)
    with pytest.raises(ValueError, match="strategy"):
        group_labels(embeddings, [1, 2], 2, "kmeans")
    with pytest.raises(ValueError, match="group_size"):
        group_labels(embeddings, [1, 2], 0)
    with pytest.raises(ValueError, match="duplicates"):
        group_labels(embeddings, [1, 1], 2)
    with pytest.raises(ValueError, match="non-negative"):
        group_labels(embeddings, [-1, 2], 2)
    with pytest.raises(ValueError, match="label_ids"):
        group_labels(embeddings, [0.5, 2.0], 2)
    with pytest.raises(ValueError, match="embeddings"):
        group_labels(None, [1, 2], 2)
    with pytest.raises(ValueError, match="at least 11 rows"):
        group_labels(embeddings, [1, 10], 2)
    with pytest.raises(ValueError, match="beta"):
        group_labels(embeddings, [1, 2], 2, beta=0.5)
    with pytest.raises(ValueError, match="label_frequencies"):
        group_labels(None, [1, 2], 2, "frequency")
    with pytest.raises(ValueError, match="NaN"):
        group_labels(torch.full((3, 4), float("nan")), [0, 1], 2, device="cpu")


# ---------------------------------------------------------------------------------------------------------
# LabelGrouping and the objective
# ---------------------------------------------------------------------------------------------------------


def test_groups_and_output_labels():
    grouping = LabelGrouping(torch.tensor([7, 2, 9, 4, 5]), group_size=2, strategy="frequency")
    assert grouping.groups().tolist() == [[7, 2], [9, 4], [5, -1]]
    output_labels = grouping.output_labels(head_ids=np.array([0, 1]))
    assert output_labels.tolist() == [0, 1, 7, 2, 9, 4, 5, -1]


def test_grouping_objective_matches_definition():
    embeddings = torch.randn(30, 5, generator=torch.Generator().manual_seed(0))
    grouping = LabelGrouping(torch.randperm(30, generator=torch.Generator().manual_seed(1))[:23], group_size=4)
    unit = F.normalize(embeddings.double(), dim=1)
    expected = []
    for group in grouping.groups():
        members = unit[group[group >= 0]]
        centroid = F.normalize(members.mean(dim=0), dim=0)
        expected += (members @ centroid).tolist()
    assert grouping_objective(embeddings, grouping, device="cpu") == pytest.approx(np.mean(expected), abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_semantic_grouping_on_cuda():
    embeddings = clustered_embeddings(20000, 32, 20000 // 32, 1.0).cuda()
    grouping = group_labels(embeddings, torch.arange(20000), 16, device="cuda")
    assert_valid_grouping(grouping, torch.arange(20000), 16)
    random = group_labels(None, torch.arange(20000), 16, "random")
    assert grouping_objective(embeddings, grouping) > grouping_objective(embeddings, random) + 0.3


def test_frequency_order_tells_counts_apart_past_float32s_integers():
    """Counts of 2^24 and 2^24 + 1 (float32 holds no integer between them: both round to 2^24): the larger one first, not the
    lower id of a tie."""
    counts = np.array([2**24, 2**24 + 1, 3])
    grouping = group_labels(None, np.arange(3), 1, "frequency", label_frequencies=counts, device="cpu")
    assert grouping.order.tolist() == [1, 0, 2]


@pytest.mark.parametrize(
    "options, argument",
    [
        ({"kmeans_iters": 0}, "kmeans_iters"),
        ({"kmeans_iters": True}, "kmeans_iters"),
        ({"kmeans_iters": 2.0}, "kmeans_iters"),
        ({"beta": 0.5}, "beta"),
        ({"beta": True}, "beta"),
    ],
)
def test_semantic_grouping_refuses_a_bad_iteration_count_or_bucket_size(options, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        group_labels(torch.randn(8, 4), torch.arange(8), 2, device="cpu", show_progress=False, **options)


@pytest.mark.parametrize("chunk_bytes", [1, 3 * 4 * 5])  # less than one row of similarities; three rows
def test_rows_join_their_centroids_alike_whatever_rows_a_chunk_of_similarities_holds(monkeypatch, chunk_bytes):
    """`_assign_to_centroids` (k-means' step) scores rows against the centroids a chunk at a time (memory bound):
    chunks of one or three rows give the nearest centroids, sums and similarities of one chunk of every row."""
    from haste_hf.labels import grouping

    generator = torch.Generator().manual_seed(0)
    x = F.normalize(torch.randn(40, 8, generator=generator), dim=1)
    centroids = F.normalize(torch.randn(5, 8, generator=generator), dim=1)
    whole = grouping._assign_to_centroids(x, centroids, with_sums=True)
    monkeypatch.setattr(grouping, "_CPU_CHUNK_BYTES", chunk_bytes)
    chunked = grouping._assign_to_centroids(x, centroids, with_sums=True)
    assert torch.equal(chunked[0], whole[0])
    torch.testing.assert_close(chunked[1], whole[1])
    torch.testing.assert_close(chunked[2], whole[2])


@pytest.mark.parametrize("group_size", [0, -1, True, 2.0])
def test_a_grouping_of_a_group_size_that_is_no_positive_integer_is_refused(group_size):
    with pytest.raises(ValueError, match=f"`group_size` must be a positive integer, got {group_size!r}"):
        LabelGrouping(order=[0, 1, 2, 3], group_size=group_size)


def test_label_ids_of_another_shape_and_frequencies_that_miss_a_label_are_refused():
    """Label ids must be a vector; `label_frequencies` a vector with an entry for every id grouped."""
    with pytest.raises(ValueError, match=r"`label_ids` must be one-dimensional, got shape \(2, 1\)"):
        group_labels(torch.randn(4, 3), [[1], [2]], 2)
    with pytest.raises(ValueError, match=r"`label_frequencies` must be one-dimensional .* \(at least 4 entries\)"):
        group_labels(None, [1, 3], 2, "frequency", label_frequencies=[5, 4, 3])
    with pytest.raises(ValueError, match=r"`label_frequencies` must be one-dimensional .* got shape \(4, 1\)"):
        group_labels(None, [1, 3], 2, "frequency", label_frequencies=[[5], [4], [3], [2]])
    grouping = group_labels(None, [1, 3], 2, "frequency", label_frequencies=[5, 4, 3, 2])
    assert grouping.order.tolist() == [1, 3]


def test_no_labels_group_to_an_empty_grouping_of_objective_0():
    empty = group_labels(torch.randn(4, 3), [], 2, device="cpu")
    assert isinstance(empty, LabelGrouping) and empty.label_count == 0 and empty.group_size == 2
    assert grouping_objective(torch.randn(4, 3), empty, device="cpu") == 0.0
