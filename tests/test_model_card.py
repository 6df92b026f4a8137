import numpy as np
import yaml
from huggingface_hub import ModelCard
from tiny_haste import make_tiny_model

from haste_hf.model_card import PLOT_FILE, HasteModelCardData, hub_model_id, write_model_card


def card_data(**fields):
    model = make_tiny_model(label_count=300, head_label_count=9)
    defaults = dict(
        model_id="someone/haste-demo",
        dataset_name="debian-tags-mini",
        grouping="semantic",
        metrics={
            "test_P@1": 0.5,
            "test_P@3": 0.3,
            "test_PSP@1": 0.2,
            "test_PSP@3": 0.25,
            "test_nDCG@3": 0.4,
            "test_loss": 3.0,
        },
        propensity={"A": 0.55, "B": 1.5},
        label_frequencies=np.random.default_rng(0).zipf(1.5, 300),
        rewiring=dict(interval=100, fraction=0.2, end=2 / 3, init="zero", scope="global"),
    )
    defaults.update(fields)
    return HasteModelCardData.from_model(model, **defaults)


def test_card_states_the_model_and_its_metrics(tmp_path):
    write_model_card(card_data(), tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    for expected in (
        "| Labels | 300 |",
        "| Dense head | 9 most frequent labels (3.0%) |",
        "291 labels in groups of G = 4, fan-in F = 8 of 32 features (75.0% sparse)",
        "| Label grouping | semantic |",
        "20% of (group, slot) pairs every 100 steps until 67% of training",
        "| k | P@k | nDCG@k | PSP@k |",
        "| 1 | 50.00 |  | 20.00 |",
        "A = 0.55, B = 1.5",
        f"]({PLOT_FILE})",
        'AutoModel.from_pretrained("someone/haste-demo", trust_remote_code=True)',
    ):
        assert expected in text, expected
    assert (tmp_path / PLOT_FILE).read_bytes().startswith(b"\x89PNG")


def test_model_index_carries_eval_results_with_propensity_args(tmp_path):
    write_model_card(card_data(), tmp_path / "README.md")
    metadata = ModelCard.load(tmp_path / "README.md").data.to_dict()
    results = metadata["model-index"][0]["results"][0]
    metrics = {metric["name"]: metric for metric in results["metrics"]}
    assert set(metrics) == {"P@1", "P@3", "PSP@1", "PSP@3", "nDCG@3"}
    assert metrics["P@1"]["value"] == 50.0 and metrics["P@1"].get("args") is None
    assert metrics["PSP@3"]["args"] == {"A": 0.55, "B": 1.5}
    assert results["dataset"]["name"] == "debian-tags-mini"
    assert yaml.safe_load((tmp_path / "README.md").read_text().split("---")[1])["library_name"] == "transformers"


def test_card_without_metrics_or_tail(tmp_path):
    model = make_tiny_model(label_count=20, head_label_count=20)
    write_model_card(HasteModelCardData.from_model(model), tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "none (all-dense output layer)" in text and "No evaluation recorded." in text
    assert not (tmp_path / PLOT_FILE).exists()


def test_card_states_the_tail_bias_and_leaves_out_an_unrecorded_start(tmp_path):
    model = make_tiny_model(label_count=300, head_label_count=9, tail_bias=True)
    write_model_card(HasteModelCardData.from_model(model), tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    assert "(75.0% sparse), a bias per label |" in text and "Start of head and tail" not in text


def test_card_names_the_base_model_by_hub_id_and_lists_the_dataset(tmp_path):
    write_model_card(
        card_data(encoder="sentence-transformers/all-MiniLM-L6-v2", dataset_id="someone/debian-tags"),
        tmp_path / "README.md",
    )
    metadata = ModelCard.load(tmp_path / "README.md").data.to_dict()
    assert metadata["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert metadata["datasets"] == ["someone/debian-tags"]
    assert metadata["pipeline_tag"] == "text-classification"


def test_a_local_datasets_name_is_no_hub_dataset(tmp_path):
    write_model_card(card_data(), tmp_path / "README.md")  # dataset_name only: the folder's name
    assert "datasets" not in ModelCard.load(tmp_path / "README.md").data.to_dict()


def test_plot_leaves_out_labels_without_training_examples(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    loglog = matplotlib.axes.Axes.loglog

    def record(axes, x, y, *args, **kwargs):
        drawn.append(np.asarray(y))
        return loglog(axes, x, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "loglog", record)
    frequencies = np.array([5, 0, 3, 0, 1] + [2] * 295)
    write_model_card(card_data(label_frequencies=frequencies), tmp_path / "README.md")
    assert len(drawn) == 1 and len(drawn[0]) == 298 and drawn[0].min() == 1


def test_hub_model_id_of_names_paths_and_cache_folders(tmp_path):
    from haste_hf.recipe import encoder_model_id

    snapshot = tmp_path / "hub" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "5c38ec7c"
    snapshot.mkdir(parents=True)
    (tmp_path / "my-encoder").mkdir()
    assert hub_model_id("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert hub_model_id(str(snapshot)) == "BAAI/bge-small-en-v1.5"
    assert hub_model_id(str(tmp_path / "my-encoder")) is None  # a local folder names no Hub model
    assert hub_model_id("not a repo id!") is None and hub_model_id(None) is None
    assert (
        encoder_model_id("minilm") == encoder_model_id("all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    )
    assert encoder_model_id(str(snapshot)) == str(snapshot)


def test_a_runs_results_are_its_cards_metrics_and_test_metrics_json(tmp_path):
    """`write_results` (the end of a training run): the test metrics, when computed, are in the card's table and in
    `test_metrics.json`; without them the card says no evaluation was recorded and no JSON is written."""
    import json
    from types import SimpleNamespace

    import torch
    from datasets import Dataset
    from tiny_encoders import planted_texts, tiny_tokenizer
    from tiny_haste import make_tiny_trainer

    from haste_hf.labels.layout import LabelLayout
    from haste_hf.model_card import CardFields, write_results

    trainer = make_tiny_trainer(
        tmp_path / "run", tiny_tokenizer(tmp_path / "tokenizer"), Dataset.from_list(planted_texts(30, 8))
    )
    layout = LabelLayout(
        label_count=30,
        head_ids=torch.arange(3),
        tail_order=torch.arange(3, 30),
        group_size=4,
        label_frequencies=torch.arange(30, 0, -1),
    )
    metrics = {"test_P@1": 0.5, "test_P@3": 0.3, "test_PSP@1": 0.2, "test_loss": 3.0}
    propensity = SimpleNamespace(a=0.55, b=1.5)
    for test_metrics in (metrics, None):
        folder = tmp_path / ("with" if test_metrics else "without")
        folder.mkdir()
        card = CardFields("my-encoder", "my-data", propensity, test_metrics=test_metrics)
        write_results(folder, trainer, layout, str(tmp_path / "run"), card)
        text = (folder / "README.md").read_text()
        if test_metrics:
            assert "| 1 | 50.00 | 20.00 |" in text and "No evaluation recorded." not in text
            assert json.loads((folder / "test_metrics.json").read_text()) == metrics
        else:
            assert "No evaluation recorded." in text and not (folder / "test_metrics.json").exists()
