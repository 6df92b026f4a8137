# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`predict_top_k` (chunks tokenised ahead, batches of a token budget sorted by length, top-k kept on the device until
the end, issue 37; a rank's share of the texts), `evaluate_split` (its metrics equal those of one text at a time) and
the evaluation settings a model folder may hold."""

import json
import types

import numpy as np
import pytest
import torch
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import AutoTokenizer
from transformers.testing_utils import CaptureLogger

from haste_hf import evaluation
from haste_hf.evaluation import EVALUATION_SETTINGS_FILE, evaluate_split, predict_top_k, saved_evaluation_settings
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


def test_one_process_without_a_group_is_rank_0_of_1():
    from haste_hf.evaluation import process_rank_and_count

    assert process_rank_and_count() == (0, 1)


@pytest.fixture
def bars(monkeypatch):
    """The `disable` of every progress bar `predict_top_k` opens."""
    import tqdm.auto

    opened, plain = [], tqdm.auto.tqdm
    monkeypatch.setattr(
        tqdm.auto, "tqdm", lambda *args, **kwargs: opened.append(kwargs["disable"]) or plain(*args, **kwargs)
    )
    return opened


def random_texts(count, seed=3):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 12))) for _ in range(count)]


def test_rank_1_of_2_predicts_its_share_without_a_bar_and_returns_every_rank_s_rows(tmp_path, monkeypatch, bars):
    """Rank 0 shows the bar; rank 1 predicts the second half of the texts and gathers rank 0's first half."""
    tokenizer, model = tiny_tokenizer(tmp_path), make_tiny_model(training=False)
    texts = random_texts(9)
    whole = predict_top_k(model, tokenizer, texts, 3, batch_size=4, max_length=16)
    first = predict_top_k(model, tokenizer, texts[:5], 3, batch_size=4, max_length=16)  # rank 0's share: 5 of 9
    assert bars == [False, False]
    gathered = []

    def all_gather_object(parts, mine):
        gathered.append(mine)
        parts[:] = [first, mine]

    monkeypatch.setattr(evaluation, "process_rank_and_count", lambda: (1, 2))
    monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: None)  # this rank's chunk count rules
    ids, scores = predict_top_k(model, tokenizer, texts, 3, batch_size=4, max_length=16)
    assert bars[-1] is True
    np.testing.assert_array_equal(gathered[0][0], whole[0][5:])
    np.testing.assert_array_equal(ids, whole[0])
    np.testing.assert_allclose(scores, whole[1], atol=1e-5)


def test_fewer_texts_than_a_batch_are_one_batch_and_no_text_is_no_row(tmp_path):
    tokenizer, model = tiny_tokenizer(tmp_path), make_tiny_model(training=False)
    calls = []

    def counting(texts, **kwargs):
        calls.append(list(texts))
        return tokenizer(texts, **kwargs)

    ids, scores = predict_top_k(model, counting, random_texts(3), 2, batch_size=8, max_length=16)
    assert len(calls) == 1 and ids.shape == scores.shape == (3, 2)
    ids, scores = predict_top_k(model, counting, [], 2, batch_size=8, max_length=16)
    assert ids.shape == scores.shape == (0, 2) and len(calls) == 1  # one process with no text tokenizes nothing


def test_texts_scored_nan_or_infinite_are_refused_naming_how_many_and_the_first(tmp_path, monkeypatch):
    tokenizer, model = tiny_tokenizer(tmp_path), make_tiny_model(training=False)
    texts = ["w1 w2", "w3", "w4 w5 w6", "w7", "w8 w9"]  # each its own length: the batch order is the length order
    plain = model.predict_topk

    def some_not_finite(input_ids, attention_mask, **kwargs):
        top = plain(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        lengths = attention_mask.sum(1)
        top.scores[lengths == 5] = float("nan")  # "w4 w5 w6": [CLS] + 3 + [SEP]
        top.scores[lengths == 3] = float("inf")  # "w3" and "w7"
        return top

    monkeypatch.setattr(model, "predict_topk", some_not_finite)
    with pytest.raises(FloatingPointError, match=r"scores 3 of 5 texts \(the first: number 2\) with NaN or infinity"):
        predict_top_k(model, tokenizer, texts, 2, batch_size=2, max_length=16)


def test_a_split_is_scored_at_the_ks_its_labels_allow_after_its_filter(monkeypatch):
    """A 3-label model has no P@5; a filtered pair (point 0, label 0) is left out of the ranking, which asks for one
    more candidate per filtered pair."""
    asked = []
    ranking = np.array([[0, 1, 2], [2, 1, 0]])

    def ranked(model, tokenizer, texts, k, *args):
        asked.append(k)
        return ranking[:, :k], None

    monkeypatch.setattr(evaluation, "predict_top_k", ranked)
    model = types.SimpleNamespace(config=types.SimpleNamespace(label_count=3))
    split = {"text": ["a", "b"], "labels": [[1], [2]]}
    plain = types.SimpleNamespace(splits={"test": split}, filters=None)
    metrics = evaluation.evaluate_split(model, None, plain, "test", None, ks=(1, 5))
    assert asked == [1] and metrics["P@1"] == 0.5 and not any(name.endswith("@5") for name in metrics)
    filtered = types.SimpleNamespace(splits={"test": split}, filters={"test": np.array([[0, 0]])})
    metrics = evaluation.evaluate_split(model, None, filtered, "test", None, ks=(1, 5))
    assert asked == [1, 2] and metrics["P@1"] == 1.0
    other_split = types.SimpleNamespace(splits={"test": split}, filters={"validation": np.array([[0, 0]])})
    assert evaluation.evaluate_split(model, None, other_split, "test", None, ks=(1,))["P@1"] == 0.5


VALID_SETTINGS = {
    "format": "bow",
    "text_fields": "title_content",
    "dataset_name": "LF-AmazonTitles-131K",
    "propensity_a": 0.55,
    "propensity_b": 1,
    "eval_batch_size": 64,
}


def test_saved_settings_are_read_with_the_tokenizers_token_limit(tmp_path):
    tiny_tokenizer(tmp_path).save_pretrained(tmp_path)
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(json.dumps({**VALID_SETTINGS, "format": None}))
    settings = saved_evaluation_settings(tmp_path)
    expected_length = AutoTokenizer.from_pretrained(tmp_path).model_max_length
    assert settings == {**{k: v for k, v in VALID_SETTINGS.items() if k != "format"}, "max_length": expected_length}


def test_a_folder_without_settings_has_none():
    assert saved_evaluation_settings("/nonexistent-folder") == {}


@pytest.mark.parametrize(
    "name, value",
    [
        ("format", "csv"),
        ("text_fields", "content"),
        ("dataset_name", "../outside"),
        ("dataset_name", "a/../b"),
        ("dataset_name", 3),
        ("propensity_a", True),
        ("propensity_a", "0.55"),
        ("propensity_b", 0),
        ("eval_batch_size", 0),
        ("eval_batch_size", -8),
        ("eval_batch_size", 8.0),
        ("eval_batch_size", False),
    ],
)
def test_a_setting_of_the_wrong_type_or_value_is_refused_naming_the_file_and_the_key(tmp_path, name, value):
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(json.dumps({**VALID_SETTINGS, name: value}))
    with pytest.raises(ValueError, match=rf"{EVALUATION_SETTINGS_FILE}: '{name}' is .*, expected .*; fix or delete"):
        saved_evaluation_settings(tmp_path)


@pytest.mark.parametrize(
    "text, message", [("{damaged", "is not a JSON file"), ("[1, 2]", "holds list, not an object of settings")]
)
def test_a_settings_file_that_is_not_an_object_is_refused(tmp_path, text, message):
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(text)
    with pytest.raises(ValueError, match=message):
        saved_evaluation_settings(tmp_path)


def test_keys_a_folder_may_not_set_are_ignored_in_a_warning(tmp_path):
    tiny_tokenizer(tmp_path).save_pretrained(tmp_path)
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(json.dumps({"output": "/etc", "eval_batch_size": 4}))
    with CaptureLogger(evaluation.logger) as captured:
        settings = saved_evaluation_settings(tmp_path)
    assert "ignoring ['output']" in captured.out and "output" not in settings and settings["eval_batch_size"] == 4
    (tmp_path / EVALUATION_SETTINGS_FILE).write_text(json.dumps({"eval_batch_size": 4}))
    with CaptureLogger(evaluation.logger) as captured:
        saved_evaluation_settings(tmp_path)
    assert "ignoring" not in captured.out
