"""Labels added to a trained model (`model.add_labels`, `haste-hf add-labels`): existing scores bit-identical,
the new labels placed, saved, reloaded, pushed, served by the pipeline and ONNX, ranked where their words are
planted; bad input refused in one line naming the argument."""

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from tiny_encoders import WORDS, planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import AutoTokenizer, pipeline

from haste_hf import HasteForExtremeClassification
from haste_hf.cli import main
from haste_hf.hub import push_to_hub
from haste_hf.modeling.configuration_haste import MAX_CONFIG_LABEL_NAMES


LABELS = 38  # 34 tail labels in groups of 4: the last group has 2 padding slots
NEW_TEXTS = ["w60 w61", "w62 w63", "w64 w65", "w66 w67", "w68 w69", "w70 w71"]
make_model = functools.partial(
    make_tiny_model, label_count=LABELS, head_label_count=4, group_size=4, fan_in=8, shuffle_labels=True, training=False
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def texts_batch(tokenizer, seed=3, size=24):
    texts = [row["text"] for row in planted_texts(LABELS, size, seed=seed)]
    return texts, tokenizer(texts, padding=True, return_tensors="pt")


def negatives(seed=5, size=40):
    return [row["text"] for row in planted_texts(LABELS, size, seed=seed)]


@pytest.mark.parametrize(
    "fields, head, fitted",
    [
        ({}, False, False),
        ({}, False, True),
        ({}, True, True),
        ({"tail_bias": True, "tail_projection_dim": 16, "head_projection_dim": 12}, False, True),
        ({"tail_bias": True}, True, False),
        ({"label_count": 40}, False, True),  # a tail without padding: every new label in new groups
    ],
)
def test_existing_scores_stay_bit_identical(tokenizer, fields, head, fitted):
    model = make_model(**fields)
    with torch.no_grad():
        if model.output_layer.tail.bias is not None:
            model.output_layer.tail.bias.normal_()
    old_count = model.config.label_count
    _, batch = texts_batch(tokenizer)
    before = model(**batch).logits
    old_layer = {name: tensor.clone() for name, tensor in model.output_layer.state_dict().items()}
    ids = model.add_labels(NEW_TEXTS, negatives=negatives() if fitted else None, tokenizer=tokenizer, head=head)

    assert ids == list(range(old_count, old_count + len(NEW_TEXTS)))
    assert model.config.label_count == old_count + len(NEW_TEXTS) == model.output_layer.label_count
    after = model(**batch).logits
    assert after.shape == (batch["input_ids"].shape[0], old_count + len(NEW_TEXTS))
    assert torch.equal(after[:, :old_count], before)
    assert torch.isfinite(after).all()
    # Top-k without the logits agrees with the logits, new labels included.
    top = model.predict_topk(**batch, k=5)
    assert torch.equal(top.label_ids, after.topk(5).indices)
    layer = model.output_layer
    layer.check_invariants()
    old_head = 4
    if head:
        assert model.config.head_label_count == old_head + len(NEW_TEXTS)
        assert layer.output_labels[old_head : old_head + len(NEW_TEXTS)].tolist() == ids
        assert torch.equal(layer.head.weight[:old_head], old_layer["head.weight"])
    else:
        assert model.config.head_label_count == old_head
        # The existing groups keep their supports and order; new labels fill the padding, then new groups follow.
        old_groups = old_layer["tail.supports"].shape[0]
        assert torch.equal(layer.tail.supports[:old_groups], old_layer["tail.supports"])
        old_tail = old_layer["output_labels"][old_head:]
        new_tail = layer.output_labels[old_head : old_head + old_tail.numel()]
        assert torch.equal(new_tail[old_tail >= 0], old_tail[old_tail >= 0])
        filled = new_tail[old_tail < 0]
        assert (filled >= old_count).all() and filled.numel() == (old_tail < 0).sum()
        assert sorted(layer.output_labels[layer.output_labels >= old_count].tolist()) == ids


def test_new_groups_have_supports_where_their_directions_are_largest():
    from haste_hf.labels.additions import supports_for

    directions = torch.zeros(2, 16)
    directions[0, [1, 5, 9]] = torch.tensor([3.0, -2.0, 1.0])
    directions[1, [5, 12]] = torch.tensor([1.0, 4.0])
    assert supports_for(directions, 4).tolist() == [1, 5, 9, 12]


def test_each_new_label_is_scored_from_its_own_weights_whatever_pairs_are_asked():
    """`NewLabelWeights.pair_logits` (what fitting reads) gives each (text, label) pair the score `logits` gives it,
    for new labels in the head, in the last group's padding slots and in a new group with padding slots; the last
    label is a head label, whose row a padding slot must not claim."""
    from haste_hf.labels.additions import NewLabelPlacement, NewLabelWeights
    from haste_hf.modeling.output_layer import HasteOutputLayer

    torch.manual_seed(0)
    layer = HasteOutputLayer(32, 30, 2, 4, 8)
    placement = NewLabelPlacement(
        head=[1, 5],
        filled=[0],
        groups=torch.tensor([[2, 3, 4, -1]]),
        supports=torch.tensor([[0, 3, 5, 9, 12, 17, 20, 31]]),
    )
    weights = NewLabelWeights(layer, placement, 6)
    with torch.no_grad():
        for param in weights.parameters():
            param.normal_()
    head_x, tail_x = layer.branch_inputs(torch.randn(3, 32))
    every = weights.logits(head_x, tail_x)
    rows, labels = torch.cartesian_prod(torch.arange(3), torch.arange(6)).T
    torch.testing.assert_close(weights.pair_logits(head_x, tail_x, rows, labels), every[rows, labels])
    # The head labels' scores are their rows' (no tail bias).
    torch.testing.assert_close(every[:, [1, 5]], head_x @ weights.head_weight.T + weights.head_bias)


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory, tokenizer):
    """A model trained on planted data (label l planted as word `w{l}`), saved with its tokenizer."""
    from datasets import Dataset
    from tiny_haste import make_tiny_trainer

    folder = tmp_path_factory.mktemp("trained")
    trainer = make_tiny_trainer(
        folder / "run",
        tokenizer,
        Dataset.from_list(planted_texts(LABELS, 96, seed=0)),
        model=make_model(training=True),
        per_device_train_batch_size=8,
        max_steps=60,
        learning_rate=3e-3,
        output_learning_rate=0.1,
        save_strategy="no",
    )
    trainer.train()
    trainer.model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def planted_examples(size=5, seed=0):
    """Texts planting the new label's words `w90 w91` among three noise words of `w50`..`w59` (no existing label's
    word), in random places."""
    import random

    rng = random.Random(seed)
    texts = []
    for _ in range(size):
        words = ["w90", "w91", *rng.sample(WORDS[50:60], 3)]
        rng.shuffle(words)
        texts.append(" ".join(words))
    return texts


def test_a_label_added_with_examples_scores_its_planted_texts_above_plain_ones(tokenizer, trained_folder):
    """The tiny random encoder separates a label's texts poorly (its 20 examples score 0.05 on average, the
    negatives 0.025), so the calibrated new label sits below an old label that scores 0.1 everywhere: ranking it
    first is `test_additions_calibration.py`'s, on an encoder whose features carry the words. Here: it scores its
    planted texts a logit above plain ones on average (1.0 measured), and keeps its name."""
    model = HasteForExtremeClassification.from_pretrained(trained_folder).eval()
    (new_id,) = model.add_labels(
        ["w90 w91"], examples=[planted_examples(size=20)], negatives=negatives(size=200), names=["planted"]
    )
    planted = tokenizer(planted_examples(size=8, seed=1), padding=True, return_tensors="pt")
    _, plain = texts_batch(tokenizer, seed=11, size=12)
    with torch.no_grad():
        assert model(**planted).logits[:, new_id].mean() > model(**plain).logits[:, new_id].mean() + 0.5
    assert model.label_names[new_id] == "planted"


def test_the_fit_changes_only_the_new_weights_and_lowers_its_loss(tokenizer):
    from haste_hf.labels import additions as label_additions

    losses = []
    fit = label_additions.fit_new_labels

    def recording_fit(*args, **kwargs):
        losses.extend(fit(*args, **kwargs))
        return losses

    model = make_model()
    encoder_before = {name: tensor.clone() for name, tensor in model.encoder.state_dict().items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(label_additions, "fit_new_labels", recording_fit)
        model.add_labels(
            ["w90 w91"], examples=[planted_examples()], negatives=negatives(), tokenizer=tokenizer, fit_steps=30
        )
    # The MAP fit's balanced loss (its level is calibrated afterwards) falls slowly on an untrained model.
    assert len(losses) == 30 and losses[-1] < losses[0]
    assert all(torch.equal(tensor, encoder_before[name]) for name, tensor in model.encoder.state_dict().items())


def test_save_reload_pipeline_and_onnx_serve_the_new_labels(tokenizer, tmp_path):
    model = make_model(tail_bias=True)
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    new_names = [f"new {i}" for i in range(len(NEW_TEXTS))]
    model.add_labels(NEW_TEXTS, negatives=negatives(), tokenizer=tokenizer, names=new_names)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["label_count"] == LABELS + len(NEW_TEXTS) and config["id2label"][str(LABELS + 2)] == "new 2"
    assert json.loads((folder / "label_names.json").read_text())[LABELS:] == new_names

    loaded = HasteForExtremeClassification.from_pretrained(folder).eval()
    texts, batch = texts_batch(tokenizer)
    assert torch.equal(loaded(**batch).logits, model(**batch).logits)
    assert loaded.label_names == model.label_names

    # The pipeline names the new labels; ONNX ranks them as predict_topk does.
    best = loaded.predict_topk(**batch, k=3)
    classifier = pipeline("text-classification", model=str(folder), top_k=3)
    served = classifier(texts)
    assert [[entry["label"] for entry in row] for row in served] == [
        [loaded.label_names[i] for i in row] for row in best.label_ids.tolist()
    ]
    export = tmp_path / "onnx"
    assert main(["export", "--model", str(folder), "--output", str(export), "-k", "3"]) == 0
    session = onnxruntime.InferenceSession(export / "model.onnx", providers=["CPUExecutionProvider"])
    label_ids, _ = session.run(None, {name: batch[name].numpy() for name in ("input_ids", "attention_mask")})
    np.testing.assert_array_equal(label_ids, best.label_ids.numpy())


def test_push_round_trip(hub, tokenizer):
    from huggingface_hub import HfApi

    model = make_model()
    model.add_labels(NEW_TEXTS, tokenizer=tokenizer, names=[f"new {i}" for i in range(len(NEW_TEXTS))])
    repo_id = f"{hub.user}/added-labels"
    push_to_hub(model, repo_id, tokenizer=tokenizer)
    loaded = HasteForExtremeClassification.from_pretrained(repo_id).eval()
    _, batch = texts_batch(tokenizer)
    assert torch.equal(loaded(**batch).logits, model(**batch).logits)
    assert loaded.label_names[LABELS:] == [f"new {i}" for i in range(len(NEW_TEXTS))]
    assert "label_names.json" in HfApi().list_repo_files(repo_id)


def test_names_past_the_config_limit_become_the_config_views(tokenizer, monkeypatch):
    from haste_hf.modeling import configuration_haste

    model = make_model()
    monkeypatch.setattr(configuration_haste, "MAX_CONFIG_LABEL_NAMES", LABELS + 2)
    assert isinstance(model.config.id2label, dict) and MAX_CONFIG_LABEL_NAMES > LABELS
    model.add_labels(NEW_TEXTS, tokenizer=tokenizer, names=[f"new {i}" for i in range(len(NEW_TEXTS))])
    # Past the limit the maps are views over the model's names (every label, the new ones too), not config.json's.
    assert isinstance(model.config.id2label, configuration_haste.LabelNames)
    assert len(model.config.id2label) == LABELS + len(NEW_TEXTS)
    assert model.config.id2label[LABELS] == "new 0" and model.config.label2id["new 0"] == LABELS
    assert "new 0" not in model.config.to_json_string()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"texts": ["w60", "  "]}, r"`texts\[1\]` is '  '"),
        ({"texts": "w60"}, r"`texts` must be a list"),
        ({"texts": []}, r"`texts` is empty"),
        ({"names": ["a", "a"]}, r"`names` lists 'a' twice"),
        ({"names": ["tag 3", "b"]}, r"`names`: 'tag 3' is already label 3"),
        ({"names": ["a"]}, r"`names` has 1 entries for 2 texts"),
        ({"examples": {"zzz": ["w1"]}, "negatives": ["w2"]}, r"`examples`: 'zzz' is not one of the new labels"),
        ({"examples": {3: ["w1"]}, "negatives": ["w2"]}, r"`examples`: label 3 exists already"),
        ({"examples": {LABELS + 5: ["w1"]}, "negatives": ["w2"]}, r"`examples`: 43 is not the id of a new label"),
        ({"examples": [["w1"], []]}, r"`negatives`: fitting the new labels on `examples` needs negative texts"),
        ({"examples": [["w1"], [""]], "negatives": ["w2"]}, r"`examples\[1\]\[0\]` is ''"),
        ({"tokenizer": None}, r"`tokenizer`: the model has no tokenizer to embed the label texts"),
        ({"fit_steps": -1}, r"`fit_steps` must be a non-negative integer"),
    ],
)
def test_bad_input_is_refused_in_one_line(tokenizer, kwargs, message):
    model = make_model()
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    arguments = {"texts": ["w60", "w61"], "names": ["a", "b"], "tokenizer": tokenizer, **kwargs}
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=message) as error:
        model.add_labels(**arguments)
    assert "\n" not in str(error.value)
    assert model.config.label_count == LABELS and model.state_dict().keys() == state.keys()


def test_duplicate_texts_without_names_are_refused_where_the_model_names_its_labels(tokenizer):
    model = make_model()
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    with pytest.raises(ValueError, match=r"`texts` lists 'w60' twice"):
        model.add_labels(["w60", "w60"], tokenizer=tokenizer)


def test_layouts_that_cannot_take_the_labels_are_refused(tokenizer):
    no_head = make_model(head_label_count=0)
    with pytest.raises(ValueError, match=r"`head`: this model has no dense head"):
        no_head.add_labels(["w60"], tokenizer=tokenizer, head=True)
    dense = make_model(head_label_count=LABELS)
    with pytest.raises(ValueError, match=r"`head`: this model has no tail"):
        dense.add_labels(["w60"], tokenizer=tokenizer, head=False)
    dense.add_labels(["w60"], tokenizer=tokenizer)  # the default placement: the head, there being no tail
    assert dense.config.head_label_count == dense.config.label_count == LABELS + 1


def test_a_share_of_a_sharded_layer_is_refused(tokenizer):
    model = make_model()

    class Share(type(model.output_layer)):
        pass

    model.output_layer.__class__ = Share
    with pytest.raises(ValueError, match=r"`model`: its output layer is a Share \(one rank's share"):
        model.add_labels(["w60"], tokenizer=tokenizer)


# ---- the command line ---------------------------------------------------------------------------------------------


def write_examples(folder, rows, label_texts):
    folder.mkdir()
    with gzip.open(folder / "trn.json.gz", "wt") as f:
        for index, (text, labels) in enumerate(rows):
            f.write(json.dumps({"uid": str(index), "title": text, "content": "", "target_ind": labels}) + "\n")
    with gzip.open(folder / "lbl.json.gz", "wt") as f:
        for index, text in enumerate(label_texts):
            f.write(json.dumps({"uid": str(index), "title": text}) + "\n")


def test_cli_add_labels_with_examples_and_negatives(tokenizer, tmp_path, dataset_dir, capsys):
    model = make_model()
    model.set_label_names([f"tag {i}" for i in range(LABELS)])
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    labels_file = tmp_path / "new_labels.json"
    labels_file.write_text(json.dumps([{"name": "planted", "text": "w90 w91"}, {"name": "other", "text": "w92"}]))
    few_shot = tmp_path / "few_shot"
    write_examples(few_shot, [("w90 w91 w50 w51", [0]), ("w92 w53", [1]), ("w90 w91 w55", [0])], ["w90 w91", "w92"])
    output = tmp_path / "added"
    argv = ["add-labels", "--model", str(folder), "--labels", str(labels_file), "--data", str(few_shot)]
    argv += ["--negatives", str(dataset_dir), "--output-dir", str(output)]
    assert main(argv) == 0
    assert "2 labels added" in capsys.readouterr().out
    loaded = HasteForExtremeClassification.from_pretrained(output).eval()
    assert loaded.config.label_count == LABELS + 2 and loaded.label_names[LABELS:] == ["planted", "other"]
    _, batch = texts_batch(tokenizer)
    assert torch.equal(loaded(**batch).logits[:, :LABELS], model(**batch).logits)
    assert AutoTokenizer.from_pretrained(output) is not None
    # A second run into the same folder needs --overwrite-output-dir; a name that exists is refused.
    assert main(argv) == 2
    assert "argument --output-dir" in capsys.readouterr().err
    labels_file.write_text(json.dumps([{"name": "tag 1", "text": "w90"}]))
    assert main([*argv[:5], "--output-dir", str(tmp_path / "other")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the loading progress bar
    assert last.startswith("haste-hf add-labels: error: argument --labels: `names`: 'tag 1' is already label 1")


@pytest.mark.parametrize("format_version", [1, 2])
def test_old_format_folders_take_new_labels_and_save_in_the_current_format(format_version, tokenizer, tmp_path):
    """Formats 1 and 2 name the output layer's tensors at the top level: they load, take the labels, keep their
    scores and save in the current format."""
    import shutil

    folder = tmp_path / f"format_{format_version}"
    shutil.copytree(Path(__file__).parent.parent / "fixtures" / f"format_{format_version}", folder)
    expected = torch.load(f"{folder}/expected.pt")
    model = HasteForExtremeClassification.from_pretrained(folder).eval()
    old_count = model.config.label_count
    inputs = (expected["input_ids"], expected["attention_mask"])
    with torch.no_grad():
        before = model(*inputs).logits
    model.add_labels(NEW_TEXTS, negatives=negatives(), tokenizer=tokenizer)
    with torch.no_grad():
        assert torch.equal(model(*inputs).logits[:, :old_count], before)
    model.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text())["format_version"] == 3
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        assert torch.equal(loaded(*inputs).logits, model(*inputs).logits)
    assert loaded.label_names[:old_count] == model.label_names[:old_count] and len(loaded.label_names) == old_count + 6


def test_add_labels_help_and_usage_errors_load_nothing_heavy():
    """As the other light commands: `add-labels --help` and a usage error import neither torch nor transformers."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom haste_hf.cli import main\n"
        "for argv in (['add-labels', '--help'], ['add-labels', '--model', '/nonexistent', '--labels', 'x.json']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr
    assert "--negatives" in result.stdout and "argument --model" in result.stderr


def test_readme_example(tmp_path, monkeypatch):
    from test_readme import example, run

    model = make_model()
    model.save_pretrained(tmp_path / "haste-demo")
    tiny_tokenizer(tmp_path / "haste-demo")
    namespace = run(example("Labels added to a trained model"), tmp_path, monkeypatch)
    assert namespace["ids"] == [LABELS]
    loaded = HasteForExtremeClassification.from_pretrained(tmp_path / "haste-demo-more")
    assert loaded.config.label_count == LABELS + 1 and loaded.label_names[LABELS] == "python3-gi"


@pytest.mark.parametrize("branch", ["head", "tail"])
def test_calibration_offsets_are_added_to_the_new_labels_biases_in_float32(branch):
    """`NewLabelWeights.add_offsets`: each new label's offset (float64, as the calibration computes them) is added
    to its own bias at float32, not rounded to another precision on the way."""
    from haste_hf.labels.additions import NewLabelWeights, place_new_labels

    model = make_tiny_model()
    layer = model.output_layer
    torch.manual_seed(0)
    directions = None if branch == "head" else torch.randn(3, model.config.tail_input_dim)
    weights = NewLabelWeights(layer, place_new_labels(layer, 3, directions, seed=0), 3)
    offsets = torch.tensor([0.123456789, -1 / 3, 2.718281828], dtype=torch.float64)
    weights.add_offsets(offsets)
    weights.add_offsets(offsets)
    bias = weights.head_bias if branch == "head" else weights.tail_bias
    assert bias.dtype == torch.float32 and torch.equal(bias, offsets.float() + offsets.float())
