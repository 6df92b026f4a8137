# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`predict_top_k`: batches tokenised ahead in threads, top-k kept on the device until the end (issue 37)."""

import numpy as np
import torch
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.evaluation import predict_top_k
from haste_hf.labels import embeddings


def test_predict_top_k_in_batches_equals_one_text_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(embeddings, "PREPARE_THREADS", 3)
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(training=False)
    rng = np.random.default_rng(5)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 12))) for _ in range(37)]
    ids, scores = predict_top_k(model, tokenizer, texts, 3, batch_size=4, max_length=16)
    assert ids.shape == scores.shape == (37, 3)
    for row, text in enumerate(texts):
        with torch.no_grad():
            top = model.predict_topk(**tokenizer([text], truncation=True, max_length=16, return_tensors="pt"), k=3)
        assert ids[row].tolist() == top.label_ids[0].tolist()
        np.testing.assert_allclose(scores[row], top.scores[0].numpy(), atol=1e-5)


def test_predict_top_k_batches_texts_of_similar_length(tmp_path):
    # Batched by length, a batch pads its texts to about their own length: the encoder reads few padding tokens.
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
