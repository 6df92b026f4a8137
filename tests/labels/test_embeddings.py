"""Label and label-text embeddings (`haste_hf.labels.embeddings`): which encoders embed texts and how, the checks of
their arguments and of what an encoder returns, and the blend of rare labels' texts into their embeddings. (The
fast text path is in test_token_batches.py; label-text rows of a model in test_label_texts.py.)"""

import logging

import pytest
import torch
import torch.nn.functional as F

from haste_hf.labels import embeddings
from haste_hf.labels.embeddings import blend_label_texts_, label_text_embeddings


def embedded(encoder, texts, **options):
    return torch.cat(list(label_text_embeddings(encoder, texts, device="cpu", **options)))


def test_a_callable_and_a_sentence_transformer_like_encoder_embed_texts_themselves(caplog):
    class Encodes:  # sentence-transformers' interface: `encode(texts, ...)`
        def encode(self, texts, batch_size, convert_to_tensor, show_progress_bar):
            assert batch_size == len(texts) and convert_to_tensor and not show_progress_bar
            return torch.tensor([[len(text), 1.0] for text in texts])

    texts = ["a", "bbb", "cc"]
    expected = torch.tensor([[1.0, 1.0], [3.0, 1.0], [2.0, 1.0]])
    torch.testing.assert_close(embedded(Encodes(), texts, batch_size=2), expected)
    torch.testing.assert_close(embedded(lambda batch: [[len(text), 1.0] for text in batch], texts), expected)
    with caplog.at_level(logging.WARNING):
        embedded(Encodes(), texts, pooling="cls")
    assert "`pooling='cls'` is ignored" in caplog.text


def test_an_encoder_of_no_known_kind_or_a_model_without_tokenizer_is_refused():
    from tiny_encoders import tiny_encoder_config
    from transformers import BertModel

    with pytest.raises(TypeError, match=r"^`encoder` must be a transformers model \(with `tokenizer`\), a model name"):
        embedded(3, ["a"])
    with pytest.raises(ValueError, match=r"^`tokenizer` is required when `encoder` is a transformers model\.$"):
        embedded(BertModel(tiny_encoder_config("bert"), add_pooling_layer=False), ["a"])


@pytest.mark.parametrize(
    "returned",
    [lambda texts: torch.ones(len(texts) + 1, 2), lambda texts: torch.ones(len(texts)), lambda texts: torch.ones(0, 2)],
)
def test_an_encoder_that_does_not_return_one_embedding_per_text_is_refused(returned):
    with pytest.raises(ValueError, match=r"^The encoder must return one embedding per text: expected shape \[2, d\]"):
        embedded(returned, ["a", "b"])


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0, None])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(batch_size):
    with pytest.raises(ValueError, match=rf"^`batch_size` must be a positive integer, got {batch_size!r}\.$"):
        label_text_embeddings(lambda texts: torch.ones(len(texts), 2), ["a"], batch_size=batch_size)


def test_a_batch_of_one_text_is_a_batch():
    blocks = list(label_text_embeddings(lambda texts: torch.ones(len(texts), 2), ["a", "b"], batch_size=1))
    assert [block.shape[0] for block in blocks] == [1, 1]


def test_texts_are_embedded_in_batches_of_the_size_given_in_order():
    seen = []

    def encoder(texts):
        seen.append(list(texts))
        return torch.tensor([[float(text), 0.0] for text in texts])

    texts = [str(i) for i in range(7)]
    blocks = list(label_text_embeddings(encoder, iter(texts), batch_size=3, device="cpu"))
    assert seen == [["0", "1", "2"], ["3", "4", "5"], ["6"]] and [block.shape[0] for block in blocks] == [3, 3, 1]
    assert torch.cat(blocks)[:, 0].tolist() == list(range(7)) and all(b.dtype == torch.float32 for b in blocks)
    (one,) = label_text_embeddings(encoder, ["2"], normalize=True, device="cpu")  # normalised rows
    torch.testing.assert_close(one, torch.tensor([[1.0, 0.0]]))


@pytest.mark.parametrize("below", [0, -2, True, 1.5])
def test_a_blend_below_a_count_that_is_not_a_positive_integer_is_refused(below):
    with pytest.raises(ValueError, match=r"^`below` \(the training count under which label texts count\) must be >= 1"):
        blend_label_texts_(torch.ones(2, 2), ["a", "b"], [0, 1], below, lambda texts: torch.ones(len(texts), 2))


@pytest.mark.parametrize(
    ("rows", "counts", "texts"), [(3, [0, 1], ["a", "b"]), (2, [0, 1, 2], ["a", "b"]), (2, [0, 1], ["a", "b", "c"])]
)
def test_a_blend_of_embeddings_counts_and_texts_of_different_lengths_is_refused(rows, counts, texts):
    with pytest.raises(ValueError, match=r"must each have one entry per label\.$"):
        blend_label_texts_(torch.ones(rows, 2), texts, counts, 2, lambda batch: torch.ones(len(batch), 2))


def test_a_blend_at_below_one_touches_only_labels_without_points_and_keeps_the_dtype():
    text = torch.tensor([0.0, 1.0])
    rows = F.normalize(torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])).to(torch.bfloat16)
    original = rows.clone()
    blended = blend_label_texts_(rows, ["x", "y", "z"], [0, 1, 5], 1, lambda batch: torch.stack([text] * len(batch)))
    assert blended == 1 and rows.dtype == torch.bfloat16
    assert torch.equal(rows[0], text.to(torch.bfloat16)) and torch.equal(rows[1:], original[1:])


def test_a_gpu_budget_is_at_least_the_minimum_and_a_cpu_one_the_batch_times_the_length():
    cpu = torch.device("cpu")
    assert embeddings.embedding_token_budget(4, 16, cpu) == 64
    assert embeddings.embedding_token_budget(4, None, cpu) == 4 * embeddings.DEFAULT_MAX_LENGTH
    assert embeddings.embedding_token_budget(1024, 256, torch.device("cuda")) == 1024 * 256


@pytest.mark.parametrize(
    "listed, typed, gathered",
    [(True, False, False), (True, True, True), (False, True, False), (False, False, False)],
    ids=["bert", "a template typing the text", "an encoder that reads no types", "neither"],
)
def test_token_types_are_gathered_only_where_the_encoder_reads_them_and_the_template_gives_some(
    tmp_path, monkeypatch, listed, typed, gathered
):
    """Gathering a text's type ids costs a Python int a token: done only where the tokenizer names `token_type_ids`
    among the encoder's inputs and its template gives a single text a type other than 0."""
    from tiny_encoders import tiny_encoder_config, tiny_tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import BertModel

    tokenizer = tiny_tokenizer(tmp_path)
    if typed:
        cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        tokenizer.backend_tokenizer.post_processor = TemplateProcessing(
            single="[CLS]:0 $A:1 [SEP]:0", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
        )
    if not listed:
        tokenizer.model_input_names = ["input_ids", "attention_mask"]
    asked, encode_rows = [], embeddings.encode_rows
    monkeypatch.setattr(
        embeddings,
        "encode_rows",
        lambda backend, texts, with_types: asked.append(with_types) or encode_rows(backend, texts, with_types),
    )
    encoder = BertModel(tiny_encoder_config("bert"), add_pooling_layer=False).eval()
    blocks = list(label_text_embeddings(encoder, ["w1 w2", "w3"], tokenizer=tokenizer, device="cpu"))
    assert sum(block.shape[0] for block in blocks) == 2
    assert asked and set(asked) == {gathered}
