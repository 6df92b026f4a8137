"""`pipeline("text-classification")` over HASTE models: top-k label names and sigmoid scores from
`HasteTextClassificationPipeline`, the plain call's class with the package installed and, through the code saved with
every model, without it. Other models keep transformers' own pipeline."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from tiny_encoders import WORDS, tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import AutoTokenizer, BertForSequenceClassification, pipeline
from transformers.pipelines.text_classification import TextClassificationPipeline

import haste_hf  # noqa: F401  (registers the auto classes)
from haste_hf import HasteConfig, HasteForExtremeClassification, HasteTextClassificationPipeline
from haste_hf.modeling import configuration_haste


LABELS = 30
TEXTS = [" ".join(WORDS[i : i + 5]) for i in (3, 11, 40)] + ["w7"]


def make_model(label_names=True):
    model = make_tiny_model(label_count=LABELS, head_label_count=3, tail_bias=True, shuffle_labels=True, training=False)
    with torch.no_grad():  # spread the scores, so that the ranking is not decided by rounding
        model.output_layer.tail.weight.mul_(8)
        model.output_layer.tail.bias.normal_()
    if label_names:
        model.set_label_names([f"tag {i}" for i in range(LABELS)])
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("haste")
    model = make_model()
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder, model


def expected(model, tokenizer, texts, k):
    """Label names and sigmoid scores of `predict_topk`, text by text."""
    rows = []
    for text in texts:
        top = model.predict_topk(**tokenizer(text, return_tensors="pt"), k=k)
        names = model.label_names or [f"LABEL_{i}" for i in range(LABELS)]
        rows.append([(names[i], s) for i, s in zip(top.label_ids[0].tolist(), torch.sigmoid(top.scores[0]).tolist())])
    return rows


def as_pairs(results):
    return [[(entry["label"], entry["score"]) for entry in row] for row in results]


def assert_same(results, rows):
    got = as_pairs(results)
    assert [[name for name, _ in row] for row in got] == [[name for name, _ in row] for row in rows]
    for got_row, row in zip(got, rows):
        assert [score for _, score in got_row] == pytest.approx([score for _, score in row], rel=1e-5, abs=1e-6)


def haste_pipeline(**kwargs):
    return pipeline("text-classification", pipeline_class=HasteTextClassificationPipeline, **kwargs)


@pytest.mark.parametrize("trust_remote_code", [None, True])
def test_the_plain_pipeline_of_a_haste_model_is_haste_s(saved, trust_remote_code):
    """`pipeline("text-classification", model=folder)`, as users type it: HASTE's pipeline (its top-k, its checks),
    not transformers' class that scores every label and reads `top_k=-1` as every label but the last."""
    folder, model = saved
    classifier = pipeline("text-classification", model=str(folder), top_k=3, trust_remote_code=trust_remote_code)
    assert type(classifier) is HasteTextClassificationPipeline
    assert type(classifier.model) is HasteForExtremeClassification
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert_same(classifier(TEXTS), expected(model, tokenizer, TEXTS, 3))
    for top_k in (-1, 0, 2.5, [], None):
        with pytest.raises(ValueError, match="`top_k` must be an integer in"):
            classifier(TEXTS[0], top_k=top_k)
    assert classifier([]) == []
    assert type(pipeline("sentiment-analysis", model=str(folder))) is HasteTextClassificationPipeline  # the alias


def test_pipeline_from_a_folder_gives_top_k_names_and_scores(saved):
    folder, model = saved
    classifier = haste_pipeline(model=str(folder), top_k=3)
    assert type(classifier) is HasteTextClassificationPipeline
    assert type(classifier.model) is HasteForExtremeClassification
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert_same(classifier(TEXTS), expected(model, tokenizer, TEXTS, 3))
    # Batched (padded) inputs rank the same labels.
    assert_same(classifier(TEXTS, batch_size=3), expected(model, tokenizer, TEXTS, 3))
    # Without top_k: the best label alone, in the parent pipeline's shape.
    best = haste_pipeline(model=str(folder))(TEXTS[0])
    assert len(best) == 1 and (best[0]["label"], best[0]["score"]) == pytest.approx(
        expected(model, tokenizer, TEXTS[:1], 1)[0][0]
    )
    raw = classifier(TEXTS[0], top_k=3, function_to_apply="none")
    top = model.predict_topk(**tokenizer(TEXTS[0], return_tensors="pt"), k=3)
    assert [entry["score"] for entry in raw] == pytest.approx(top.scores[0].tolist(), rel=1e-5)


def test_pipeline_truncates_long_texts_at_the_tokenizers_length(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    tokenizer = tiny_tokenizer(tmp_path)
    tokenizer.model_max_length = 12  # what training stores with the model
    tokenizer.save_pretrained(tmp_path)
    long_text = " ".join(WORDS[:90])  # beyond the encoder's 64 positions
    cut = tokenizer(long_text, truncation=True, return_tensors="pt")
    assert cut["input_ids"].shape[1] == 12
    top = model.predict_topk(**cut, k=2)
    results = haste_pipeline(model=str(tmp_path))(long_text, top_k=2)
    assert [entry["label"] for entry in results] == [model.label_names[i] for i in top.label_ids[0].tolist()]
    # transformers' own pipeline truncates when asked, as for any classifier.
    stock = pipeline("text-classification", model=str(tmp_path), pipeline_class=TextClassificationPipeline)
    results = stock(long_text, top_k=2, truncation=True)
    assert [entry["label"] for entry in results] == [model.label_names[i] for i in top.label_ids[0].tolist()]


def test_pipeline_never_builds_label_order_logits(saved, monkeypatch):
    folder, _ = saved
    classifier = haste_pipeline(model=str(folder), top_k=2)

    def refuse(*args, **kwargs):
        raise AssertionError("the pipeline scored every label")

    monkeypatch.setattr(classifier.model.output_layer, "logits", refuse)
    monkeypatch.setattr(classifier.model.output_layer, "_position_logits", refuse)
    monkeypatch.setattr(classifier.model, "forward", refuse)
    assert len(classifier(TEXTS)) == len(TEXTS)


def test_pipeline_from_a_model_object_without_label_names(tmp_path):
    model = make_model(label_names=False)
    tokenizer = tiny_tokenizer(tmp_path)
    for classifier in (
        pipeline("text-classification", model=model, tokenizer=tokenizer, top_k=4),
        haste_pipeline(model=model, tokenizer=tokenizer, top_k=4),
    ):
        assert_same(classifier(TEXTS), expected(model, tokenizer, TEXTS, 4))
        assert classifier(TEXTS)[0][0]["label"].startswith("LABEL_")


@pytest.mark.parametrize(
    "call_kwargs, message",
    [
        ({"top_k": None}, "top_k=None"),
        ({"top_k": 0}, r"\[1, 30\]"),
        ({"top_k": LABELS + 1}, r"\[1, 30\]"),
        ({"top_k": 2.5}, r"`top_k` must be an integer in \[1, 30\].*got 2.5"),
        ({"top_k": []}, r"`top_k` must be an integer.*got \[\]"),
        ({"top_k": "3"}, r"`top_k` must be an integer.*got '3'"),
        ({"top_k": True}, r"`top_k` must be an integer.*got True"),
        ({"top_k": 2, "function_to_apply": "softmax"}, "'sigmoid'"),
    ],
)
def test_pipeline_refuses_what_top_k_cannot_serve(saved, call_kwargs, message):
    folder, _ = saved
    classifier = haste_pipeline(model=str(folder))
    with pytest.raises(ValueError, match=message):
        classifier(TEXTS[0], **call_kwargs)
    with pytest.raises(ValueError, match=message):  # given when the pipeline is built
        haste_pipeline(model=str(folder), **call_kwargs)


def test_pipeline_takes_a_numpy_integer_top_k(saved):
    folder, _ = saved
    classifier = haste_pipeline(model=str(folder))
    assert (
        classifier(TEXTS[0], top_k=np.int64(3)) == classifier(TEXTS[0], top_k=3)
        and len(classifier(TEXTS[0], top_k=3)) == 3
    )


def test_other_models_are_served_as_before(tmp_path):
    torch.manual_seed(0)
    bert = BertForSequenceClassification(tiny_encoder_config("bert")).eval()
    tokenizer = tiny_tokenizer(tmp_path)
    installed = pipeline("text-classification", model=bert, tokenizer=tokenizer, top_k=None)
    assert type(installed) is TextClassificationPipeline  # the registered class builds transformers' own for others
    assert type(pipeline("text-classification", model=bert, tokenizer=tokenizer)) is TextClassificationPipeline
    assert type(HasteTextClassificationPipeline(model=bert, tokenizer=tokenizer)) is TextClassificationPipeline
    stock = TextClassificationPipeline(model=bert, tokenizer=tokenizer)
    assert installed(TEXTS) == stock(TEXTS, top_k=None)
    installed = haste_pipeline(model=bert, tokenizer=tokenizer, top_k=None)
    assert type(installed) is TextClassificationPipeline
    assert installed(TEXTS) == stock(TEXTS, top_k=None)
    assert installed(TEXTS[0], top_k=1, function_to_apply="softmax") == stock(
        TEXTS[0], top_k=1, function_to_apply="softmax"
    )


def test_the_pipeline_registers_whatever_loads_first(saved):
    """`import haste_hf` after `transformers.pipelines`, or the HASTE pipeline module imported before transformers'
    pipelines: the plain call is HASTE's either way."""
    folder, _ = saved
    orders = {
        "transformers first": "import transformers.pipelines; import haste_hf",
        "pipeline module first": "import haste_hf.modeling.pipeline_haste",
    }
    for order in orders.values():
        script = f"""{order}
from transformers import pipeline
classifier = pipeline("text-classification", model={str(folder)!r})
assert type(classifier).__name__ == "HasteTextClassificationPipeline", type(classifier)
"""
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert result.returncode == 0, (order, result.stderr[-3000:])


def test_config_names_the_pipeline_only_for_remote_code(saved):
    folder, _ = saved
    saved_config = json.loads((folder / "config.json").read_text())
    assert (
        saved_config["custom_pipelines"]["text-classification"]["impl"]
        == "modeling_haste.HasteTextClassificationPipeline"
    )
    assert saved_config["auto_map"]["AutoModelForSequenceClassification"] == saved_config["auto_map"]["AutoModel"]
    # The installed package names its pipeline in transformers' registry: no trust_remote_code needed.
    assert HasteConfig.from_pretrained(folder).custom_pipelines == {}


def test_past_the_config_names_the_exported_pipeline_serves(tmp_path, monkeypatch):
    """Past `MAX_CONFIG_LABEL_NAMES` the config holds no names: with the package, transformers' pipeline names the
    labels from the model's `label_names.json`, as the HASTE pipeline (`pipeline_class`) does."""
    monkeypatch.setattr(configuration_haste, "MAX_CONFIG_LABEL_NAMES", LABELS - 1)
    model = make_model()
    assert model.config.num_labels == LABELS and model.config.id2label[3] == "tag 3"
    model.save_pretrained(tmp_path / "model")
    tokenizer = tiny_tokenizer(tmp_path / "model")
    assert "id2label" not in json.loads((tmp_path / "model" / "config.json").read_text())
    for classifier in (
        pipeline("text-classification", model=str(tmp_path / "model"), top_k=3),
        haste_pipeline(model=str(tmp_path / "model"), top_k=3),
    ):
        assert_same(classifier(TEXTS), expected(model, tokenizer, TEXTS, 3))


def test_pipeline_without_the_package_through_remote_code(saved, tmp_path):
    folder, model = saved
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["haste_hf"] = None  # as if the package were not installed
        from transformers import pipeline
        try:
            pipeline("text-classification", model={str(folder)!r}, top_k=3)
        except ValueError as error:
            assert "trust_remote_code=True" in str(error), error
        else:
            raise SystemExit("ran the exported pipeline without trust_remote_code=True")
        classifier = pipeline("text-classification", model={str(folder)!r}, trust_remote_code=True, top_k=3)
        assert type(classifier).__module__.startswith("transformers_modules"), type(classifier).__module__
        assert type(classifier).__name__ == "HasteTextClassificationPipeline", type(classifier)
        for top_k in (-1, 0, 2.5, []):
            try:
                classifier("w7", top_k=top_k)
            except ValueError as error:
                assert "`top_k` must be an integer in [1, 30]" in str(error), error
            else:
                raise SystemExit(f"served top_k={{top_k!r}}")
        assert classifier([]) == []
        assert type(classifier.model).__module__.startswith("transformers_modules"), type(classifier.model).__module__
        with open("results.json", "w") as f:
            json.dump(classifier({TEXTS!r}, batch_size=2), f)
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert_same(json.loads((tmp_path / "results.json").read_text()), expected(model, tokenizer, TEXTS, 3))


# ------------------------------------------------------------------------------------- no texts, long texts
# transformers' own pipeline (`pipeline_class=TextClassificationPipeline`) indexes the first text of `[]` for every
# model; the HASTE pipeline answers `[]`, and a text longer than the encoder reads is refused in one line by the model
# itself, whichever pipeline serves it.

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
    stock = pipeline("text-classification", model=str(folder), pipeline_class=TextClassificationPipeline)
    with pytest.raises(ValueError, match=r"holds texts of 92 tokens, and the encoder reads at most 64: truncate"):
        stock(LONG_TEXT, top_k=2)
    with pytest.raises(ValueError, match="encoder reads at most 64"):
        haste_pipeline(model=str(folder))(LONG_TEXT, top_k=2, truncation=False)
    assert len(stock(LONG_TEXT, top_k=2, truncation=True, max_length=64)) == 2
