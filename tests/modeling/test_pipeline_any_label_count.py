"""With the package installed, `pipeline("text-classification", model=folder)` serves a HASTE model of any label count
without extra arguments: past `MAX_CONFIG_LABEL_NAMES` the names are not in config.json, and `id2label` reads them
from the model's `label_names.json`."""

import json

import pytest
import torch
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import pipeline
from transformers.pipelines.text_classification import TextClassificationPipeline

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES


LABELS = MAX_CONFIG_LABEL_NAMES + 1
TEXTS = [" ".join(WORDS[i : i + 5]) for i in (3, 11, 40)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("many_labels")
    model = make_tiny_model(
        label_count=LABELS, head_label_count=300, group_size=16, shuffle_labels=True, training=False
    )
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    model.save_pretrained(folder)
    tiny_tokenizer(folder)
    return folder, model


def best_labels(model, tokenizer, text, k):
    with torch.no_grad():
        top = model.predict_topk(**tokenizer(text, return_tensors="pt"), k=k)
    return [model.label_names[label_id] for label_id in top.label_ids[0].tolist()], torch.sigmoid(top.scores[0])


def test_a_folder_past_the_config_names_is_served_without_extra_arguments(saved):
    folder, model = saved
    assert "id2label" not in json.loads((folder / "config.json").read_text())
    classifier = pipeline("text-classification", model=str(folder))
    assert isinstance(classifier, TextClassificationPipeline)
    for text, ranked in zip(TEXTS, classifier(TEXTS, top_k=3)):
        names, scores = best_labels(model, classifier.tokenizer, text, 3)
        assert [entry["label"] for entry in ranked] == names
        assert [entry["score"] for entry in ranked] == pytest.approx(scores.tolist(), rel=1e-5)
    best = classifier(TEXTS[0])  # without top_k: the best label alone, as for any classifier
    assert best[0]["label"] == best_labels(model, classifier.tokenizer, TEXTS[0], 1)[0][0]


def test_label_maps_past_the_config_names(saved):
    """`id2label` / `label2id` answer as dicts would, from the names the model read, and stay out of config.json."""
    folder, _ = saved
    model = HasteForExtremeClassification.from_pretrained(folder)
    config = model.config
    assert config.id2label[LABELS - 1] == f"tag {LABELS - 1}" and config.label2id["tag 17"] == 17
    assert len(config.id2label) == LABELS and list(config.id2label)[:2] == [0, 1]
    with pytest.raises(KeyError):
        config.id2label[LABELS]
    assert "id2label" not in config.to_dict() and "label2id" not in config.to_dict()
    unnamed = HasteConfig.from_pretrained(folder)  # the config alone holds no names: transformers' placeholders
    assert unnamed.id2label[5] == "LABEL_5" and unnamed.label_names is None
