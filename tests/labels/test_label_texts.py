"""Labels from their own texts: head rows and tail weights started from the encoder's embedding of each label's
text, and label texts in the semantic grouping of rarely seen labels (issue 31, item 1)."""

import gzip
import json
import math

import pytest
import torch
import torch.nn.functional as F
from tiny_encoders import WORDS, planted_texts, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import set_seed

from haste_hf.cli import main
from haste_hf.labels.embeddings import blend_label_texts_, label_text_embeddings
from haste_hf.labels.layout import LabelLayout
from haste_hf.labels.text_init import init_from_label_texts_
from haste_hf.modeling.output_layer import HasteOutputLayer
from haste_hf.recipe import build_model, load_encoder, train


ROW_NORM = 1 / math.sqrt(3)  # of a row drawn U(-1/sqrt(n), 1/sqrt(n)), whatever n


def expected_rows(layer: HasteOutputLayer, label_ids, embeddings, scale=1.0, center=None) -> dict:
    """By hand, label by label: `label id -> (branch, where, row)` of what the init writes."""

    def branch_input(projection, embedding):
        return embedding if projection is None else projection.weight @ embedding + projection.bias

    expected = {}
    for label, embedding in zip(label_ids.tolist(), embeddings):
        position = int((layer.output_labels == label).nonzero())
        projection = layer.head_projection if position < layer.head_label_count else layer.tail_projection
        x = branch_input(projection, embedding)
        if center is not None:
            x = x - branch_input(projection, center)
        if position < layer.head_label_count:
            expected[label] = ("head", position, scale * ROW_NORM * x / x.norm())
        else:
            group, member = divmod(position - layer.head_label_count, layer.group_size)
            on_support = torch.stack([x[int(feature)] for feature in layer.tail.supports[group]])
            expected[label] = ("tail", (group, member), scale * ROW_NORM * on_support / on_support.norm())
    return expected


def check_rows(layer: HasteOutputLayer, expected: dict, before: dict, rtol=1e-5, atol=1e-6) -> None:
    """The rows of `expected` hold their values (within `rtol`, `atol`); every other row of the head and the tail
    is as in `before`."""
    head, tail = before["head"].clone(), before["tail"].clone()
    for branch, where, row in expected.values():
        if branch == "head":
            head[where] = row
        else:
            tail[where] = row
    torch.testing.assert_close(layer.head.weight, head, rtol=rtol, atol=atol)
    torch.testing.assert_close(layer.tail.weight, tail, rtol=rtol, atol=atol)


@pytest.mark.parametrize("projections", [False, True])
@pytest.mark.parametrize("centered", [False, True])
def test_label_embeddings_become_head_rows_and_tail_weights_on_the_group_support(projections, centered):
    torch.manual_seed(0)
    dims = dict(head_projection_dim=12, tail_projection_dim=10) if projections else {}
    # Scattered head ids, so that positions and label ids differ; the last tail group is padded.
    layer = HasteOutputLayer(16, 23, head_labels=[5, 17, 2, 9], group_size=4, fan_in=6, **dims)
    before = {"head": layer.head.weight.detach().clone(), "tail": layer.tail.weight.detach().clone()}
    label_ids = torch.tensor([17, 0, 22, 9, 3, 14])  # two head labels, four tail labels in three groups
    embeddings = torch.randn(label_ids.numel(), 16)
    center = torch.randn(16) if centered else None

    layer.init_from_label_embeddings_(label_ids, embeddings, scale=2.5, center=center)

    check_rows(layer, expected_rows(layer, label_ids, embeddings, scale=2.5, center=center), before)


def test_label_embeddings_refused_when_they_do_not_fit_the_layer():
    layer = HasteOutputLayer(8, 10, head_labels=2, group_size=4, fan_in=4)
    for label_ids, embeddings, scale, message in (
        ([0, 1], torch.randn(3, 8), 1.0, "one embedding of 8 features per label id"),
        ([0, 1], torch.randn(2, 7), 1.0, "one embedding of 8 features per label id"),
        ([0, 10], torch.randn(2, 8), 1.0, r"outside \[0, 10\)"),
        ([3, 3], torch.randn(2, 8), 1.0, "lists a label twice"),
        ([0, 1], torch.randn(2, 8), 0.0, "`scale`"),
    ):
        with pytest.raises(ValueError, match=message):
            layer.init_from_label_embeddings_(label_ids, embeddings, scale=scale)
    with pytest.raises(ValueError, match="`center` must be one embedding of 8 features"):
        layer.init_from_label_embeddings_([0], torch.randn(1, 8), center=torch.randn(1, 8))


def test_label_texts_stream_through_the_model_encoder_in_batches(tmp_path, caplog):
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(
        label_count=11, head_label_count=3, group_size=4, fan_in=8, shuffle_labels=True, tail_projection_dim=24
    )
    model.config.normalize = True
    layer = model.output_layer
    torch.nn.init.normal_(layer.tail_projection.bias)  # (zero at first): the rows now depend on the embeddings' norm
    before = {"head": layer.head.weight.detach().clone(), "tail": layer.tail.weight.detach().clone()}
    label_ids = torch.tensor([7, 1, 4, 10, 0])
    texts = ["w7 w3", "w1", "   ", "w10 w2 w9", "w0"]  # label 4's text is blank: it keeps its weights

    initialised = init_from_label_texts_(
        model, texts, tokenizer=tokenizer, label_ids=label_ids, batch_size=2, show_progress=False
    )

    assert initialised == 4 and "1 of 5 labels have a blank text" in caplog.text
    assert model.training  # the encoder ran in eval mode, and the model's mode came back
    model.eval()
    with torch.no_grad():
        embeddings = torch.cat([model.encode(**tokenizer([text], return_tensors="pt"))[0] for text in texts])
    kept = [0, 1, 3, 4]  # centred on the mean of the texts embedded (fewer than CENTER_SAMPLE: all of them)
    # The init embedded the texts in padded batches of 2, the reference one by one: float32 sums of other shapes and
    # orders (which the CPU's kernels and thread count choose), a few ulps (~1e-7) per value through the encoder.
    # Centring subtracts unit vectors from their mean (a digit of cancellation) and a tail row keeps the 8 features
    # of its support before it is renormalised (another): up to ~1e-5 on rows of norm 0.58 (8.8e-6 seen on a 2-core
    # CI machine), far under the 0.44 by which rows without the centring differ.
    expected = expected_rows(layer, label_ids[kept], embeddings[kept], center=embeddings[kept].mean(0))
    check_rows(layer, expected, before, rtol=1e-4, atol=3e-5)
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(5))  # embedded as the model embeds: normalised


def test_label_texts_are_embedded_where_the_model_is_on_a_machine_with_a_gpu(tmp_path, monkeypatch):
    """`init_from_label_texts_` without `device` runs the encoder where the model is: a model on the CPU of a machine
    with a GPU (said here by `torch.cuda.is_available`) stays on the CPU, and its labels start from their texts."""
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(label_count=11, head_label_count=3, group_size=4, fan_in=8)
    before = model.output_layer.head.weight.detach().clone()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    texts = [f"w{label}" for label in range(11)]
    assert init_from_label_texts_(model, texts, tokenizer=tokenizer, show_progress=False) == 11
    assert {parameter.device.type for parameter in model.parameters()} == {"cpu"}
    assert not torch.equal(model.output_layer.head.weight, before)


def varied_texts(count, seed):
    """`count` texts of 1 to 30 words in a random order of lengths, one of them blank."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 31, (count,), generator=generator).tolist()
    words = torch.randint(0, len(WORDS), (sum(lengths),), generator=generator).tolist()
    texts, start = [], 0
    for length in lengths:
        texts.append(" ".join(WORDS[i] for i in words[start : start + length]))
        start += length
    texts[count // 2] = " "
    return texts


def one_at_a_time(model, tokenizer, texts, max_length):
    """The model's embedding of each text, encoded alone."""
    model.eval()
    with torch.no_grad():
        return torch.cat(
            [
                model.encode(**tokenizer([t], truncation=True, max_length=max_length, return_tensors="pt"))[0]
                for t in texts
            ]
        )


def test_label_texts_sorted_by_length_start_the_rows_of_their_own_labels(tmp_path, monkeypatch, caplog):
    """Texts of very different lengths, chunks of 8 sorted by length into token-budget batches: each label's rows
    come from its own text (the sort scrambles no row), as the texts embedded one at a time say."""
    monkeypatch.setattr("haste_hf.labels.embeddings.CHUNK_TEXTS", 8)
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(
        label_count=48, head_label_count=8, group_size=4, fan_in=8, shuffle_labels=True, tail_projection_dim=24
    )
    layer = model.output_layer
    before = {"head": layer.head.weight.detach().clone(), "tail": layer.tail.weight.detach().clone()}
    label_ids = torch.randperm(48, generator=torch.Generator().manual_seed(1))[:40]
    texts = varied_texts(40, seed=2)

    options = dict(tokenizer=tokenizer, label_ids=label_ids, batch_size=3, max_length=24, show_progress=False)
    assert init_from_label_texts_(model, texts, **options) == 39

    embeddings = one_at_a_time(model, tokenizer, texts, 24)
    kept = [i for i in range(40) if i != 20]  # the blank text's label keeps its weights
    expected = expected_rows(layer, label_ids[kept], embeddings[kept], center=embeddings[kept].mean(0))
    check_rows(layer, expected, before, rtol=1e-4, atol=3e-5)  # tolerance: see the test above


@pytest.mark.parametrize("sample", [4096, 16])
def test_label_texts_within_the_center_sample_are_embedded_once(tmp_path, monkeypatch, sample):
    """Up to `CENTER_SAMPLE` texts the center's sample is every text: they are embedded once, for the center and
    the rows, and the rows are those of the center embedded apart, bit for bit; above it, the sample is embedded
    apart."""
    from haste_hf.labels import text_init

    monkeypatch.setattr(text_init, "CENTER_SAMPLE", sample)
    monkeypatch.setattr("haste_hf.labels.embeddings.CHUNK_TEXTS", 8)
    tokenizer = tiny_tokenizer(tmp_path)
    texts = varied_texts(40, seed=6)
    options = dict(tokenizer=tokenizer, batch_size=3, max_length=24, show_progress=False)
    models = [make_tiny_model(label_count=40, head_label_count=8, shuffle_labels=True) for _ in range(2)]
    embedded = []
    original = text_init.label_text_embeddings

    def counted(encoder, texts, **embedding_options):
        embedded.append(len(texts))
        return original(encoder, texts, **embedding_options)

    monkeypatch.setattr(text_init, "label_text_embeddings", counted)
    assert init_from_label_texts_(models[0], texts, **options) == 39
    assert embedded == ([39] if sample >= 39 else [39, sample])
    kept = torch.tensor([i for i in range(40) if i != 20])
    center_options = dict(pooling=models[1].config.pooling, normalize=models[1].config.normalize, device="cpu")
    center = text_init._center(models[1], texts, kept, options | center_options)
    init_from_label_texts_(models[1], texts, center=center, **options)
    for name in ("output_layer.head.weight", "output_layer.tail.weight"):
        assert torch.equal(models[0].state_dict()[name], models[1].state_dict()[name]), name


def test_label_texts_sorted_by_length_blend_into_their_own_labels(tmp_path, monkeypatch):
    monkeypatch.setattr("haste_hf.labels.embeddings.CHUNK_TEXTS", 8)
    tokenizer = tiny_tokenizer(tmp_path)
    model = make_tiny_model(label_count=8)
    texts = varied_texts(40, seed=3)
    counts = torch.randint(0, 6, (40,), generator=torch.Generator().manual_seed(4))
    embeddings = F.normalize(torch.randn(40, 32, generator=torch.Generator().manual_seed(5)), dim=1)
    original = embeddings.clone()
    options = dict(tokenizer=tokenizer, batch_size=3, max_length=24, device="cpu", show_progress=False)

    blended = blend_label_texts_(embeddings, texts, counts, 4, model.encoder, pooling=model.config.pooling, **options)

    rare = [i for i in range(40) if counts[i] < 4 and i != 20]
    assert blended == len(rare)
    text_embeddings = F.normalize(one_at_a_time(model, tokenizer, texts, 24), dim=1)
    weights = (counts.float() / 4).unsqueeze(1)
    expected = original.clone()
    expected[rare] = F.normalize(weights[rare] * original[rare] + (1 - weights[rare]) * text_embeddings[rare], dim=1)
    torch.testing.assert_close(embeddings, expected, rtol=1e-4, atol=3e-5)


def test_label_text_embeddings_check_their_arguments_at_the_call():
    with pytest.raises(ValueError, match="`batch_size`"):
        label_text_embeddings(lambda texts: torch.ones(len(texts), 2), ["a"], batch_size=0)
    batches = list(
        label_text_embeddings(
            lambda texts: torch.ones(len(texts), 2), iter(["a", "b", "c"]), batch_size=2, normalize=True, device="cpu"
        )
    )
    assert [batch.shape for batch in batches] == [(2, 2), (1, 2)]
    torch.testing.assert_close(batches[1], torch.full((1, 2), 1 / math.sqrt(2)))


@pytest.mark.parametrize("label_count", [0, -1, True, 2.0])
def test_label_embeddings_from_instances_refuse_a_label_count_that_is_not_positive(label_count):
    from haste_hf.labels.embeddings import compute_label_embeddings

    with pytest.raises(ValueError, match="`label_count` must be a positive integer"):
        compute_label_embeddings(lambda texts: torch.ones(len(texts), 2), ["a"], [[0]], label_count)


def test_rarely_seen_labels_blend_their_text_into_their_embedding():
    directions = torch.eye(4)
    text_vectors = {"zero": directions[0], "one": directions[1], "two": directions[2], "many": directions[3]}
    embed = lambda texts: torch.stack([3 * text_vectors[text] for text in texts])  # noqa: E731  (not unit: normalised)
    embeddings = F.normalize(torch.tensor([[0.0, 0, 0, 0], [1, 0, 0, 1], [0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]))
    original = embeddings.clone()
    counts = [0, 1, 3, 9, 2]
    texts = ["zero", "one", "two", "many", "  "]

    blended = blend_label_texts_(embeddings, texts, counts, 4, embed, batch_size=2, device="cpu", show_progress=False)

    assert blended == 3  # labels 0, 1, 2; label 3 is seen often enough, label 4 has no text
    torch.testing.assert_close(embeddings[0], directions[0])  # no training point: its text alone
    torch.testing.assert_close(embeddings[1], F.normalize(0.25 * original[1] + 0.75 * directions[1], dim=0))
    torch.testing.assert_close(embeddings[2], F.normalize(0.75 * original[2] + 0.25 * directions[2], dim=0))
    torch.testing.assert_close(embeddings[3:], original[3:])


def test_labels_without_training_points_are_grouped_by_their_text():
    """Labels 4-7 have no training point: without their texts they close the tail in id order; with them, each
    joins the seen label its text describes."""
    from datasets import Dataset

    directions = torch.eye(4)
    vectors = {f"text{i}": directions[i] for i in range(4)} | {f"label{i}": directions[i % 4] for i in range(8)}
    embed = lambda texts: torch.stack([vectors[text] for text in texts])  # noqa: E731
    split = Dataset.from_dict({"text": [f"text{i}" for i in range(4)], "labels": [[i] for i in range(4)]})
    options = dict(head_label_count=0, encoder=embed, device="cpu", show_progress=False)
    plain = LabelLayout.from_training_split(split, 8, 2, **options)
    with_texts = LabelLayout.from_training_split(
        split, 8, 2, label_texts=[f"label{i}" for i in range(8)], label_text_grouping_below=1, **options
    )
    assert plain.tail_order[4:].tolist() == [4, 5, 6, 7]
    assert sorted(sorted(group) for group in with_texts.grouping.groups().tolist()) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="the grouping is 'frequency'"):
        LabelLayout.from_training_split(
            split, 8, 2, strategy="frequency", label_texts=["x"] * 8, label_text_grouping_below=1, **options
        )


# ------------------------------------------------------------------------------------------------ the recipe


@pytest.fixture(scope="module")
def described_dataset(tmp_path_factory):
    """Planted data whose label texts are the planted words (label l: `w{l}`)."""
    label_count, path = 12, tmp_path_factory.mktemp("described")
    for name, size, seed in (("trn", 96, 0), ("tst", 24, 1)):
        with gzip.open(path / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(planted_texts(label_count, size, seed=seed)):
                f.write(json.dumps({"uid": str(i), "title": row["text"], "target_ind": row["labels"]}) + "\n")
    with gzip.open(path / "lbl.json.gz", "wt") as f:
        for label in range(label_count):
            f.write(json.dumps({"uid": str(label), "title": WORDS[label]}) + "\n")
    return path


RECIPE = dict(group_size=4, fan_in=8, max_length=16, head_label_fraction=0.25)
FROZEN = {"max_steps": 1, "learning_rate": 0.0, "output_learning_rate": 0.0, "use_cpu": True, "report_to": []}


def test_the_recipe_starts_the_output_layer_from_the_label_texts(described_dataset, encoder_dir, tmp_path):
    """With every learning rate at 0, the trained output layer is the init: the same rows as the init applied by
    hand to the run's layout over the same encoder."""
    run = train(
        described_dataset,
        str(encoder_dir),
        str(tmp_path / "run"),
        training_args=FROZEN,
        init_from_label_texts=True,
        label_text_init_scale=2.0,
        tail_projection_dim=16,
        **RECIPE,
    )
    encoder, tokenizer = load_encoder(str(encoder_dir))
    set_seed(run.trainer.args.seed)  # as the run seeds its new weights: the same projection and biases
    reference = build_model(encoder, run.layout, label_count=12, fan_in=8, tail_projection_dim=16)
    texts = [WORDS[label] for label in range(12)]
    assert init_from_label_texts_(reference, texts, tokenizer=tokenizer, scale=2.0) == 12  # every label has a text
    for name in ("head.weight", "tail.weight", "tail_projection.weight"):
        torch.testing.assert_close(
            run.model.output_layer.state_dict()[name], reference.output_layer.state_dict()[name], msg=name
        )
    plain = train(described_dataset, str(encoder_dir), str(tmp_path / "plain"), training_args=FROZEN, **RECIPE)
    assert not torch.equal(plain.model.output_layer.tail.weight, run.model.output_layer.tail.weight)


def test_label_text_options_through_the_command_line(described_dataset, encoder_dir, tmp_path, capsys):
    flags = ["--group-size", "4", "--fan-in", "8", "--max-length", "16", "--max-steps", "2", "--use-cpu"]
    # Every label has fewer than 1000 points: all are grouped by their texts too.
    status = main(
        ["train", "--data", str(described_dataset), "--encoder", str(encoder_dir), "--output-dir", str(tmp_path / "m")]
        + flags
        + ["--init-from-label-texts", "--label-text-grouping-below", "1000", "--report-to", "none"]
    )
    assert status == 0, capsys.readouterr().err
    assert (tmp_path / "m" / "test_metrics.json").is_file()
    status = main(
        ["group", "--data", str(described_dataset), "--encoder", str(encoder_dir), "--output", str(tmp_path / "l")]
        + ["--group-size", "4", "--max-length", "16", "--label-text-grouping-below", "1000", "--head-fraction", "0.25"]
    )
    assert status == 0, capsys.readouterr().err
    assert LabelLayout.load(tmp_path / "l").tail_label_count == 9


def test_label_text_init_falls_back_to_random_rows_without_label_texts():
    """`init_from_label_texts` (on by default, issue 39) is off for data without label texts, said in one warning;
    data with them keeps it on, silently."""
    from types import SimpleNamespace

    from transformers.testing_utils import CaptureLogger

    from haste_hf import recipe as recipe_module
    from haste_hf.recipe import RecipeArguments, _dataset_of

    without = SimpleNamespace(label_texts=None, train_label_frequencies=[1, 2])
    with_texts = SimpleNamespace(label_texts=["zero", "one"], train_label_frequencies=[1, 2])
    asked = RecipeArguments()
    assert asked.init_from_label_texts
    with CaptureLogger(recipe_module.logger) as captured:
        _, label_texts, recipe = _dataset_of(without, asked)
    assert label_texts is None and not recipe.init_from_label_texts and asked.init_from_label_texts
    assert captured.out.count("has no label texts") == 1 and "start at random" in captured.out, captured.out
    with CaptureLogger(recipe_module.logger) as captured:
        _, label_texts, recipe = _dataset_of(with_texts, asked)
    assert label_texts == ["zero", "one"] and recipe.init_from_label_texts and captured.out == ""


def test_label_text_options_refused_without_label_texts(encoder_dir, tmp_path, capsys):
    """A raw text + sparse labels folder without Y.txt has no label texts: grouping by them is refused in one line
    naming the flag (their init falls back to random rows instead: the test above)."""
    data = tmp_path / "no-label-texts"
    data.mkdir()
    (data / "trn_X.txt").write_text("w1 w2\nw3\n")
    (data / "trn_X_Y.txt").write_text("2 4\n0:1 1:1\n2:1\n")
    common = ["--data", str(data), "--encoder", str(encoder_dir)]
    for argv in (
        ["train", *common, "--output-dir", str(tmp_path / "m"), "--label-text-grouping-below", "2", "--use-cpu"],
        ["group", *common, "--output", str(tmp_path / "l"), "--label-text-grouping-below", "2"],
    ):
        capsys.readouterr()
        assert main(argv) == 1
        messages = [line for line in capsys.readouterr().err.splitlines() if line.startswith("haste-hf")]
        flag = "--label-text-grouping-below"
        assert len(messages) == 1 and flag in messages[0] and "has none" in messages[0], messages
        assert messages[0].startswith(f"haste-hf {argv[0]}: error: "), messages


def test_label_text_grouping_refused_beside_a_layout_that_fixes_the_groups(described_dataset, encoder_dir, tmp_path):
    run = train(described_dataset, str(encoder_dir), str(tmp_path / "a"), training_args=FROZEN, **RECIPE)
    with pytest.raises(ValueError, match="the given label layout holds already"):
        train(
            described_dataset,
            str(encoder_dir),
            str(tmp_path / "b"),
            training_args=FROZEN,
            layout=run.layout,
            label_text_grouping_below=2,
            **RECIPE,
        )


def test_an_encoder_given_by_its_folder_embeds_with_the_tokenizer_given_else_its_own(tmp_path):
    """`label_text_embeddings` of an encoder named by a path: the tokenizer passed wins over the folder's; without
    one, the folder's tokenizer is loaded. The folder's tokenizer here numbers the words backwards, so the two
    embed a text differently."""
    from tiny_encoders import SPECIAL_TOKENS, tiny_encoder_config
    from transformers import BertModel, BertTokenizer

    torch.manual_seed(0)
    BertModel(tiny_encoder_config("bert"), add_pooling_layer=False).save_pretrained(tmp_path / "encoder")
    backwards = BertTokenizer(vocab={token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS[::-1])})
    backwards.save_pretrained(tmp_path / "encoder")
    given = tiny_tokenizer(tmp_path / "given")
    model = BertModel.from_pretrained(tmp_path / "encoder").eval()
    texts = ["w1 w2 w3", "w7"]

    def embedded(encoder, tokenizer):
        return torch.cat(list(label_text_embeddings(encoder, texts, tokenizer=tokenizer, pooling="mean")))

    by_path_given = embedded(str(tmp_path / "encoder"), given)
    by_path_own = embedded(str(tmp_path / "encoder"), None)
    torch.testing.assert_close(by_path_given, embedded(model, given))
    torch.testing.assert_close(by_path_own, embedded(model, backwards))
    assert not torch.allclose(by_path_given, by_path_own, atol=1e-3)


def test_label_texts_of_another_count_than_the_labels_are_refused():
    model = make_tiny_model(label_count=11, head_label_count=3)
    with pytest.raises(ValueError, match=r"^`label_texts` has 10 texts for 11 labels: give one text per label\.$"):
        init_from_label_texts_(model, ["w1"] * 10, tokenizer=None)
    with pytest.raises(ValueError, match=r"^`label_texts` has 3 texts for 2 labels: give one text per label\.$"):
        init_from_label_texts_(model, ["w1"] * 3, tokenizer=None, label_ids=[4, 5])


def test_a_model_without_a_tokenizer_is_refused_naming_the_argument(tmp_path):
    from haste_hf.labels.embeddings import resolve_tokenizer

    model = make_tiny_model()
    given = tiny_tokenizer(tmp_path / "given")
    assert resolve_tokenizer(model, given) is given
    with pytest.raises(ValueError, match=r"^`tokenizer`: the model has no tokenizer to embed the label texts \("):
        resolve_tokenizer(model, None)
    model.save_pretrained(tmp_path / "model")  # a folder without a tokenizer
    with pytest.raises(ValueError, match=r"pass tokenizer=AutoTokenizer\.from_pretrained\(<its folder or encoder>\)"):
        resolve_tokenizer(type(model).from_pretrained(tmp_path / "model"), None)
    given.save_pretrained(tmp_path / "model")
    loaded = resolve_tokenizer(type(model).from_pretrained(tmp_path / "model"), None)
    assert loaded("w3 w5")["input_ids"] == given("w3 w5")["input_ids"]
