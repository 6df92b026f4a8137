"""The training recipe through its Python API (the CLI tests run it through `haste-hf train`)."""

import json
from functools import partial

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download

from haste_hf import LabelLayout
from haste_hf.metrics import METRIC_NAMES
from haste_hf.recipe import RecipeArguments, train


OPTIONS = dict(group_size=4, fan_in=8, max_length=16, grouping="frequency")


def tiny_run(dataset_dir, encoder_dir, output_dir, **training):
    return train(
        dataset_dir,
        str(encoder_dir),
        str(output_dir),
        validation_fraction=0,
        training_args={"max_steps": 3, "per_device_train_batch_size": 16, "use_cpu": True, **training},
        **OPTIONS,
    )


def test_a_run_is_a_function_of_its_seed(dataset_dir, encoder_dir, tmp_path):
    first, again = (tiny_run(dataset_dir, encoder_dir, tmp_path / name, seed=3) for name in ("a", "b"))
    other = tiny_run(dataset_dir, encoder_dir, tmp_path / "c", seed=4)
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, again.model.state_dict()[name]), name
    assert first.test_metrics == again.test_metrics
    assert not torch.equal(first.model.output_layer.head.weight, other.model.output_layer.head.weight)


def test_run_uses_the_layout_it_is_given_and_saves_what_it_trained(dataset_dir, encoder_dir, tmp_path):
    from datasets import Dataset

    from haste_hf.recipe import load_dataset

    dataset = load_dataset(str(dataset_dir))
    layout = LabelLayout.from_training_split(
        dataset.splits["train"], dataset.label_count, 4, head_label_count=5, strategy="random", seed=1
    )
    train_on_layout = partial(train, dataset_dir, str(encoder_dir), layout=layout, fan_in=8, max_length=16)
    run = train_on_layout(
        str(tmp_path / "model"), validation_fraction=0, training_args={"max_steps": 2, "use_cpu": True}
    )
    assert run.layout is layout and torch.equal(run.model.output_layer.output_labels, layout.output_labels())
    saved = json.loads((tmp_path / "model" / "test_metrics.json").read_text())
    assert saved == run.test_metrics and {"P@1", "PSP@5"} <= set(saved)
    with pytest.raises(ValueError, match="another training split"):
        other = Dataset.from_dict({"text": ["w1"], "labels": [[1]]})
        layout.check_split(other)
    with pytest.raises(ValueError, match="validation-fraction"):  # a held-out split is another split
        train_on_layout(
            str(tmp_path / "held-out"), validation_fraction=0.1, training_args={"max_steps": 1, "use_cpu": True}
        )


def test_recipe_options_go_in_one_place(dataset_dir, encoder_dir, tmp_path):
    with pytest.raises(ValueError, match="not both"):
        train(dataset_dir, str(encoder_dir), str(tmp_path), recipe_args=RecipeArguments(), group_size=4)
    with pytest.raises(TypeError, match="group_sise"):
        train(dataset_dir, str(encoder_dir), str(tmp_path), group_sise=4)


def test_push_to_hub_pushes_the_saved_folder_once_with_its_test_metrics(hub, dataset_dir, encoder_dir, tmp_path):
    repo_id = f"{hub.user}/recipe-push"
    run = tiny_run(
        dataset_dir,
        encoder_dir,
        tmp_path / "model",
        push_to_hub=True,
        hub_model_id=repo_id,
        save_strategy="steps",
        save_steps=1,
    )
    files = set(HfApi().list_repo_files(repo_id))
    assert {"config.json", "model.safetensors", "README.md", "label_names.json", "tokenizer_config.json"} <= files
    assert not any(name.startswith("checkpoint-") for name in files)  # the Trainer pushed no checkpoint of its own
    assert len(HfApi().list_repo_commits(repo_id)) == 2  # the repository's creation, then the one upload
    with open(hf_hub_download(repo_id, "README.md")) as file:
        card = file.read()
    row = "| 1 | " + " | ".join(f"{100 * run.test_metrics[f'{name}@1']:.2f}" for name in METRIC_NAMES) + " |"
    assert row in card  # the card the recipe wrote, with the test metrics


def test_evaluation_with_more_filtered_labels_than_the_model_has_to_spare(tmp_path):
    """max(k) + the filtered labels of a point exceed the label count: all labels are ranked, the filtered
    ones dropped, and fewer than k left count as misses."""
    import numpy as np
    from datasets import Dataset, DatasetDict
    from tiny_encoders import tiny_encoder_config, tiny_tokenizer

    from haste_hf import HasteConfig, HasteForExtremeClassification
    from haste_hf.data import XMCDataset
    from haste_hf.evaluation import evaluate_split
    from haste_hf.metrics import compute_xmc_metrics

    torch.manual_seed(0)
    config = HasteConfig(encoder=tiny_encoder_config("bert"), label_count=6, head_label_count=2, group_size=2, fan_in=4)
    model = HasteForExtremeClassification(config).eval()
    tokenizer = tiny_tokenizer(tmp_path)
    texts, labels = ["w1 w2 w3", "w4 w5", "w6"], [[0, 3], [5], [1, 2]]
    filters = np.array([[0, 1], [0, 2], [0, 4], [1, 0], [2, 3]])  # point 0: 5 + 3 candidates of 6 labels
    data = XMCDataset(
        splits=DatasetDict(test=Dataset.from_dict({"text": texts, "labels": labels})),
        label_texts=None,
        label_count=6,
        filters={"test": filters},
    )
    metrics = evaluate_split(model, tokenizer, data, "test", None, max_length=8)

    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    ranked = logits.argsort(dim=1, descending=True).tolist()
    expected_top = np.full((3, 5), -1)
    for point, order in enumerate(ranked):
        kept = [label for label in order if [point, label] not in filters.tolist()][:5]
        expected_top[point, : len(kept)] = kept
    assert metrics == compute_xmc_metrics(expected_top, labels, ks=(1, 3, 5))


def test_the_run_keeps_the_checkpoint_of_the_best_validation_p_at_1(dataset_dir, encoder_dir, tmp_path):
    """Evaluated every 2 steps, the run ends on the model of its highest validation P@1 (the best checkpoint): not
    on its last, nor on its lowest P@1 or highest loss."""
    run = train(
        dataset_dir,
        str(encoder_dir),
        str(tmp_path / "run"),
        validation_fraction=0.25,
        training_args={
            "max_steps": 8,
            "eval_steps": 2,
            "per_device_train_batch_size": 16,
            "learning_rate": 3e-3,
            "output_learning_rate": 0.3,
            "use_cpu": True,
        },
        **OPTIONS,
    )
    evaluations = [(entry["step"], entry["eval_P@1"]) for entry in run.trainer.state.log_history if "eval_P@1" in entry]
    scores = [score for _, score in evaluations]
    assert len(evaluations) == 4 and len(set(scores)) > 1  # the P@1s differ: the choice is a choice
    best_step, best = max(evaluations, key=lambda evaluation: evaluation[1])  # the first of the highest
    assert run.trainer.state.best_metric == best
    assert run.trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")


def test_tail_bias_through_the_command_line(dataset_dir, encoder_dir, tmp_path, capsys):
    """Every tail label has a trained bias by default (the tail study's lever, issue 39); with `--no-tail-bias`,
    none. The model card states the tail's defaults (bias, the tail's rate, label-text init) and their absence."""
    from haste_hf import HasteForExtremeClassification
    from haste_hf.cli import main

    common = ["--data", str(dataset_dir), "--encoder", str(encoder_dir), "--group-size", "2", "--fan-in", "8"]
    common += ["--max-length", "16", "--max-steps", "2", "--use-cpu", "--report-to", "none"]
    old_defaults = ["--no-tail-bias", "--output-tail-lr-scale", "1", "--no-init-from-label-texts"]
    for flags, name in ((old_defaults, "plain"), ([], "bias")):
        assert main(["train", *common, "--output-dir", str(tmp_path / name), *flags]) == 0, capsys.readouterr().err
    plain = HasteForExtremeClassification.from_pretrained(tmp_path / "plain").output_layer.tail
    tail = HasteForExtremeClassification.from_pretrained(tmp_path / "bias").output_layer.tail
    assert plain.bias is None and tail.bias is not None and tail.bias.shape == (tail.weight.shape[0] * 2,)
    assert bool(tail.bias.ne(0).any())  # trained, not left at its start
    cards = {name: (tmp_path / name / "README.md").read_text() for name in ("plain", "bias")}
    for stated in (
        "a bias per label",
        "tail at 2.0x the rate",
        "| Start of head and tail | the label texts' embeddings |",
    ):
        assert stated in cards["bias"] and stated not in cards["plain"], stated
    assert "| Start of head and tail | random |" in cards["plain"]


def test_label_texts_are_read_only_where_an_option_reads_them():
    from types import SimpleNamespace

    from haste_hf.recipe import label_texts_for

    with_texts, without = SimpleNamespace(label_texts=["zero", "one"]), SimpleNamespace(label_texts=None)
    assert label_texts_for(without, "data/x", init_from_label_texts=False, label_text_grouping_below=None) is None
    assert label_texts_for(with_texts, "data/x", init_from_label_texts=False) is None
    assert label_texts_for(with_texts, "data/x", init_from_label_texts=True) == ["zero", "one"]
    with pytest.raises(ValueError, match=r"`label_text_grouping_below` \(--label-text-grouping-below\) .* data/x has"):
        label_texts_for(without, "data/x", init_from_label_texts=False, label_text_grouping_below=5)


def test_the_output_layer_is_built_in_the_dtype_it_trains_in(dataset_dir, encoder_dir, tmp_path, monkeypatch):
    """One process builds its head and tail in `output_layer_dtype` (at 10^8 labels the fp32 build held 25 GB of host
    memory before the Trainer cast it), with the weights of the fp32 build cast: the trained model is the same."""
    import contextlib

    from haste_hf import recipe
    from haste_hf.modeling import initialization

    built, build_model = [], recipe.build_model

    def recording_build(*args, **kwargs):
        model = build_model(*args, **kwargs)
        built.append((model.output_layer.head.weight.dtype, model.output_layer.tail.weight.dtype))
        return model

    monkeypatch.setattr(recipe, "build_model", recording_build)
    run = tiny_run(dataset_dir, encoder_dir, tmp_path / "born", max_steps=2, output_layer_dtype="bfloat16")
    assert built == [(torch.bfloat16, torch.bfloat16)]
    monkeypatch.setattr(initialization, "output_rows_on", lambda *args: contextlib.nullcontext())
    cast = tiny_run(dataset_dir, encoder_dir, tmp_path / "cast", max_steps=2, output_layer_dtype="bfloat16")
    assert built[1] == (torch.float32, torch.float32)
    for name, tensor in run.model.state_dict().items():
        assert torch.equal(tensor, cast.model.state_dict()[name]), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_process_builds_its_output_layer_on_the_gpu_it_trains_on(dataset_dir, encoder_dir, tmp_path, monkeypatch):
    """On a GPU the head and tail are born there in bf16 (no host copy of the layer), label-text init included, and the
    run trains and saves."""
    from haste_hf import recipe

    built, build_model = [], recipe.build_model

    def recording_build(*args, **kwargs):
        model = build_model(*args, **kwargs)
        built.extend(module.weight for module in (model.output_layer.head, model.output_layer.tail))
        return model

    monkeypatch.setattr(recipe, "build_model", recording_build)
    run = tiny_run(dataset_dir, encoder_dir, tmp_path / "gpu", max_steps=2, use_cpu=False, bf16=True)
    assert [(weight.device.type, weight.dtype) for weight in built] == [("cuda", torch.bfloat16)] * 2
    assert run.model.output_layer.tail.weight.isfinite().all() and run.test_metrics


def test_a_run_without_save_writes_no_model_card_or_metrics(dataset_dir, encoder_dir, tmp_path):
    """`train(save=False)`: the trained model and its test metrics come back; the folder gets no model, card or
    `test_metrics.json` (what a saved run writes there)."""
    run = train(
        dataset_dir,
        str(encoder_dir),
        str(tmp_path / "out"),
        save=False,
        validation_fraction=0,
        training_args={"max_steps": 2, "per_device_train_batch_size": 16, "use_cpu": True, "save_strategy": "no"},
        **OPTIONS,
    )
    assert run.output_dir is None and "P@1" in run.test_metrics
    written = {path.name for path in (tmp_path / "out").iterdir()} if (tmp_path / "out").exists() else set()
    assert not written & {"config.json", "model.safetensors", "README.md", "test_metrics.json"}, written


def test_train_counts_the_training_labels_once(dataset_dir, encoder_dir, tmp_path, monkeypatch):
    # The read counts the training split and fingerprints it in one pass; the layout (computed, or read from a file
    # and checked against the split) takes both from there. A validation hold-out is another split: counted apart.
    from haste_hf.labels import layout as layout_module
    from haste_hf.recipe import load_dataset

    counted = []
    count_labels = layout_module.count_labels

    def counting(labels, label_count, **kwargs):
        counted.append(len(labels))
        return count_labels(labels, label_count, **kwargs)

    monkeypatch.setattr(layout_module, "count_labels", counting)
    run = tiny_run(dataset_dir, encoder_dir, tmp_path / "computed")
    train_split = load_dataset(str(dataset_dir)).splits["train"]
    assert counted == [len(train_split)] * 2  # the run's read, then this test's
    frequencies, fingerprint, points = count_labels(train_split, 30)
    assert run.layout.split_fingerprint == fingerprint and run.layout.train_points == points == 160
    assert run.layout.label_frequencies.tolist() == frequencies.tolist()
    run.layout.save(tmp_path / "layout.safetensors")
    counted.clear()
    train(
        dataset_dir,
        str(encoder_dir),
        str(tmp_path / "from-file"),
        layout=str(tmp_path / "layout.safetensors"),
        validation_fraction=0,
        training_args={"max_steps": 1, "use_cpu": True},
        **OPTIONS,
    )
    assert counted == [160]
    counted.clear()
    train(
        dataset_dir,
        str(encoder_dir),
        str(tmp_path / "held-out"),
        validation_fraction=0.25,
        training_args={"max_steps": 1, "use_cpu": True},
        **OPTIONS,
    )
    assert counted == [160, 120]


def test_without_a_validation_split_evaluation_during_training_and_best_model_selection_are_off(tmp_path):
    from haste_hf.recipe import _training_arguments
    from haste_hf.training.training_args import HasteTrainingArguments

    given = HasteTrainingArguments(
        output_dir=str(tmp_path),
        eval_strategy="steps",
        save_strategy="steps",
        eval_steps=5,
        save_steps=5,
        load_best_model_at_end=True,
        push_to_hub=True,
    )
    args, push = _training_arguments(given, None, has_validation=False)
    assert args.eval_strategy == "no" and args.load_best_model_at_end is False
    assert push is True and args.push_to_hub is False  # the recipe pushes once, with the test metrics and card
    assert given.eval_strategy == "steps" and given.load_best_model_at_end is True  # the caller's are left as given
    kept, _ = _training_arguments(given, str(tmp_path / "elsewhere"), has_validation=True)
    assert kept.eval_strategy == "steps" and kept.load_best_model_at_end is True
    assert kept.output_dir == str(tmp_path / "elsewhere")
