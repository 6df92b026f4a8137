"""What the text-classification pipeline does with what `predict` would refuse or answer: a `top_k` that is no count
of labels (test_pipeline_haste.py), no texts, and texts longer than the encoder reads. transformers' own pipeline
indexes the first text of `[]` for every model; the HASTE pipeline (`pipeline_class`, or the saved code) answers
`[]`, and a too-long text is refused in one line by the model itself, whichever pipeline serves it."""

import pytest
from test_pipeline_haste import expected, haste_pipeline, make_model
from tiny_encoders import WORDS, tiny_tokenizer
from transformers import AutoTokenizer, pipeline


LONG_TEXT = " ".join(WORDS[:90])  # 92 tokens; the tiny encoders read 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A saved model whose tokenizer names no length (as a tokenizer saved without `model_max_length`)."""
    path = tmp_path_factory.mktemp("haste")
    make_model().save_pretrained(path)
    tiny_tokenizer(path)
    return path


def test_no_texts_give_no_results(folder):
    classifier = haste_pipeline(model=str(folder))
    assert classifier([]) == [] and classifier([], top_k=3) == []
    with pytest.raises(ValueError, match="`top_k` must be an integer"):
        classifier([], top_k=0)


def test_a_text_beyond_the_encoders_positions_is_cut_there(folder):
    classifier = haste_pipeline(model=str(folder))
    model, tokenizer = classifier.model, AutoTokenizer.from_pretrained(folder)
    assert tokenizer.model_max_length > 64
    cut = tokenizer.decode(tokenizer(LONG_TEXT, truncation=True, max_length=64)["input_ids"], skip_special_tokens=True)
    names = [entry["label"] for entry in classifier(LONG_TEXT, top_k=3)]
    assert names == [name for name, _ in expected(model, tokenizer, [cut], 3)[0]]


def test_a_text_beyond_the_encoders_positions_is_refused_in_one_line(folder):
    stock = pipeline("text-classification", model=str(folder))
    with pytest.raises(ValueError, match=r"holds texts of 92 tokens, and the encoder reads at most 64: truncate"):
        stock(LONG_TEXT, top_k=2)
    with pytest.raises(ValueError, match="encoder reads at most 64"):
        haste_pipeline(model=str(folder))(LONG_TEXT, top_k=2, truncation=False)
    assert len(stock(LONG_TEXT, top_k=2, truncation=True, max_length=64)) == 2
