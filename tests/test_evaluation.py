# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`predict_top_k`: chunks tokenised ahead, batches of a token budget sorted by length, top-k kept on the device
until the end; `evaluate_split`'s metrics from it equal those of one text at a time (issue 37)."""

import numpy as np
import torch
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.evaluation import evaluate_split, predict_top_k
from haste_hf.labels import embeddings, token_batches
from haste_hf.metrics import Propensity, compute_xmc_metrics


def test_predict_top_k_in_batches_equals_one_text_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(embeddings, "PREPARE_THREADS", 3)
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(training=False)
    rng = np.random.default_rng(5)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 12))) for _ in range(37)]
    assert token_batches.fast_backend(tokenizer, 16) is not None  # the token-chunk path
    ids, scores = predict_top_k(model, tokenizer, texts, 3, batch_size=4, max_length=16)
    assert ids.shape == scores.shape == (37, 3)
    for row, text in enumerate(texts):
        with torch.no_grad():
            top = model.predict_topk(**tokenizer([text], truncation=True, max_length=16, return_tensors="pt"), k=3)
        assert ids[row].tolist() == top.label_ids[0].tolist()
        np.testing.assert_allclose(scores[row], top.scores[0].numpy(), atol=1e-5)


def test_predict_top_k_batches_texts_of_similar_length(tmp_path):
    # A tokenizer without a Rust backend (here a callable): each chunk's texts batched by characters, a batch pads its texts to about their own length: the encoder reads few padding tokens.
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(training=False)
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, size=size)) for size in rng.permutation(np.repeat([1, 12], 8))]
    widths = []

    def recording(texts, **kwargs):
        batch = tokenizer(texts, **kwargs)
        widths.append(batch["input_ids"].shape[1])
        return batch

    ids, _ = predict_top_k(model, recording, texts, 3, batch_size=8, max_length=16)
    longest = max(texts, key=len)
    long_width = len(tokenizer([longest], truncation=True, max_length=16)["input_ids"][0])
    assert len(widths) == 2 and min(widths) < long_width  # the short texts' batch is not padded to the long ones
    expected, _ = predict_top_k(model, tokenizer, texts[::-1], 3, batch_size=8, max_length=16)
    assert ids.tolist() == expected[::-1].tolist()  # rows in the texts' order, whatever the batches


def test_predict_top_k_batches_of_a_token_budget(tmp_path, monkeypatch):
    # A fast tokenizer: batches of at most batch_size x max_length padded tokens, so short texts go many to a batch
    # (the host's launches per batch no longer set the pace on a GPU), every text scored once.
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(training=False)
    rng = np.random.default_rng(11)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 4))) for _ in range(64)]
    shapes = []
    predict_topk = model.predict_topk

    def recording(input_ids, attention_mask, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return predict_topk(input_ids, attention_mask, **kwargs)

    monkeypatch.setattr(model, "predict_topk", recording)
    ids, _ = predict_top_k(model, tokenizer, texts, 3, batch_size=4, max_length=16)
    assert sum(rows for rows, _ in shapes) == len(texts)
    assert all(rows * width <= 4 * 16 for rows, width in shapes)
    assert max(rows for rows, _ in shapes) > 4  # texts of 3 to 5 tokens: more than batch_size to a batch
    monkeypatch.setattr(model, "predict_topk", predict_topk)
    expected, _ = predict_top_k(model, tokenizer, texts[::-1], 3, batch_size=4, max_length=16)
    assert ids.tolist() == expected[::-1].tolist()


def test_evaluate_split_metrics_equal_those_of_one_text_at_a_time(tmp_path, monkeypatch):
    # One pass gives the metrics: equal to those of the top-k computed one text at a time, chunks of a few texts
    # (several chunks, each in several batches) and the tail of the last chunk included.
    from datasets import Dataset

    from haste_hf.data import XMCDataset

    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 16)
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(label_count=40, training=False, shuffle_labels=True)
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 14))) for _ in range(83)]
    labels = [sorted(rng.choice(40, size=rng.integers(1, 4), replace=False).tolist()) for _ in texts]
    data = XMCDataset(
        splits={"test": Dataset.from_dict({"text": texts, "labels": labels})}, label_texts=None, label_count=40
    )
    propensity = Propensity.from_frequencies(rng.integers(0, 30, size=40), 100)
    metrics = evaluate_split(model, tokenizer, data, "test", propensity, batch_size=4, max_length=16)
    top = []
    for text in texts:
        with torch.no_grad():
            inputs = tokenizer([text], truncation=True, max_length=16, return_tensors="pt")
            top.append(model.predict_topk(**inputs, k=5).label_ids[0].numpy())
    expected = compute_xmc_metrics(np.stack(top), labels, propensity=propensity)
    assert metrics.keys() == expected.keys() and {"P@5", "PSP@5", "nDCG@5"} <= metrics.keys()
    for name, value in expected.items():
        assert metrics[name] == value, name


def test_ranks_call_the_model_as_often_whatever_their_batches(tmp_path):
    # Under several processes each rank predicts its share, and a sharded output layer scores a batch on every rank
    # together: the ranks agree on each chunk's batch count, and join with empty batches where theirs run out.
    from distributed_predict_chunks import TEXTS
    from launch import TESTS, torchrun

    torchrun([str(TESTS / "distributed_predict_chunks.py"), str(tmp_path)], tmp_path, timeout=300)
    ranks = [torch.load(tmp_path / f"rank-{rank}.pt", weights_only=False) for rank in (0, 1)]
    assert ranks[1]["calls"] == [2, 2, 0]  # its chunk in two batches, then an empty batch beside rank 0's last chunk
    assert ranks[0]["calls"] == [4, 0, 1]  # one batch, an empty one beside rank 1's second, then its last chunk
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    expected, expected_scores = predict_top_k(make_tiny_model(training=False), tokenizer, TEXTS, 3, 2, 16)
    for rank in ranks:
        assert rank["ids"].tolist() == expected.tolist()
        np.testing.assert_allclose(rank["scores"], expected_scores, atol=1e-5)
