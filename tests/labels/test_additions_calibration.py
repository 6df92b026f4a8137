"""Labels added to a trained model rank among the others (`haste_hf/labels/priors.py`): the text map puts a new
label where its words are, the calibration puts its scores on the old labels' level, so the old labels' rankings
stay where they were on texts without the new labels' words.

The model: a bag-of-words encoder (a tiny BERT without layers, its position and segment embeddings zero: mean
pooling averages the normalised embeddings of a text's words, so its features carry the planted words, as a real
encoder's carry a text's words), frozen, and an output layer trained on its features of planted texts (label l
planted as word `w{l}` among noise words), named by its words, as `haste-hf train` names a model by its label texts.
A random tiny encoder mixes the words past what any map from a label's name can recover. Every tail label sees
every feature (fan-in = hidden size): the test is of the text map and the level, not of the supports.
"""

import copy
import random

import pytest
import torch
from tiny_encoders import VOCAB_SIZE, WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import BertConfig

from haste_hf.labels import priors
from haste_hf.labels.additions import embed_texts


LABELS = 38
HIDDEN = 64
NOISE = WORDS[40:80]  # no label's word, and not the new labels' words either
NEW_TEXTS = ["w90 w91", "w92 w93", "w94 w95"]


def planted(labels, size, seed, extra=()):
    """Texts planting each of `labels` (one or two a text) and `extra` words among three noise words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        chosen = sorted(rng.sample(labels, rng.randint(1, 2))) if labels else []
        words = [WORDS[label] for label in chosen] + list(extra) + rng.sample(NOISE, 3)
        rng.shuffle(words)
        rows.append((" ".join(words), chosen))
    return rows


def negatives():
    return [text for text, _ in planted(list(range(LABELS)), 200, seed=9)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def trained(tokenizer):
    """The output layer trained on the frozen bag-of-words encoder's features of planted texts."""
    encoder = BertConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN,
        num_hidden_layers=0,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    model = make_tiny_model(
        label_count=LABELS, head_label_count=4, group_size=4, fan_in=HIDDEN, shuffle_labels=True, encoder=encoder
    )
    model.eval()
    with torch.no_grad():
        model.encoder.embeddings.position_embeddings.weight.zero_()
        model.encoder.embeddings.token_type_embeddings.weight.zero_()
    model.set_label_names([WORDS[label] for label in range(LABELS)])
    rows = planted(list(range(LABELS)), 400, seed=0)
    features = embed_texts(model, tokenizer, [text for text, _ in rows], batch_size=64, max_length=16)
    targets = torch.full((len(rows), 2), -100)
    for index, (_, labels) in enumerate(rows):
        targets[index, : len(labels)] = torch.tensor(labels)
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.output_layer.parameters(), lr=0.03)
    for _ in range(300):
        optimizer.zero_grad()
        model.output_layer.loss(features, targets).backward()
        optimizer.step()
    return model


def scores(model, tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits


def added(trained, tokenizer, **options):
    model = copy.deepcopy(trained)
    ids = model.add_labels(NEW_TEXTS, tokenizer=tokenizer, names=[f"new {i}" for i in range(len(NEW_TEXTS))], **options)
    return model, ids


def planted_with(new_id, text):
    """12 planted texts of old labels that also plant the words of a new label's text."""
    return [row for row, _ in planted(list(range(LABELS)), 12, seed=new_id, extra=text.split())]


@pytest.mark.parametrize("head", [False, None])
@pytest.mark.parametrize("given", ["text", "text and negatives", "text, 5 examples and negatives"])
def test_old_rankings_keep_their_top_and_a_new_label_tops_the_texts_of_its_words(trained, tokenizer, given, head):
    """From text alone: no new label tops a text without its words, old scores bit-identical. Given negatives (the
    copy of the text's features joins the map, `priors.blended_map`), each new label tops most of the texts that
    plant its words next to one or two old labels' words: in the tail 31 of the 36 texts (10 with the ridge map
    alone); in the head, the default placement on this model, 23 (20 with 5 examples): its copy has the fixed weight
    `priors.HEAD_BLEND` where the tail's is distilled, and this bag-of-words encoder's copy is what knows the words."""
    old_texts = [text for text, _ in planted(list(range(LABELS)), 60, seed=7)]
    before = scores(trained, tokenizer, old_texts)
    options = {"negatives": negatives(), "fit_steps": 0} if given == "text and negatives" else {}
    if given == "text, 5 examples and negatives":
        examples = [planted_with(100 + index, text)[:5] for index, text in enumerate(NEW_TEXTS)]
        options = {"negatives": negatives(), "examples": examples}
    model, ids = added(trained, tokenizer, head=head, **options)
    after = scores(model, tokenizer, old_texts)
    assert torch.equal(after[:, :LABELS], before)
    assert torch.equal(after.argmax(dim=1), before.argmax(dim=1))  # no new label tops a text without its words
    if given != "text":
        firsts = [
            int((scores(model, tokenizer, planted_with(i, text)).argmax(dim=1) == i).sum())
            for i, text in zip(ids, NEW_TEXTS)
        ]
        least, least_each = (27, 7) if head is False else (19, 4)
        assert sum(firsts) >= least and min(firsts) >= least_each, firsts


@pytest.mark.parametrize("fit_steps", [0, 200])
def test_new_scores_sit_on_the_old_labels_level(trained, tokenizer, fit_steps):
    """On texts without a label's words, a new label's mean sigmoid score is what an old label's is on texts without
    its word (within a factor of 3); where its words are, it scores as an old label does on its own word's texts.
    Scores left uncalibrated (the offsets or the scale 10x) fail it."""
    model, ids = added(trained, tokenizer, negatives=negatives(), fit_steps=fit_steps)
    rows = planted(list(range(LABELS)), 200, seed=11)
    probabilities = torch.sigmoid(scores(model, tokenizer, [text for text, _ in rows]))
    truth = torch.zeros(len(rows), LABELS, dtype=torch.bool)
    for index, (_, labels) in enumerate(rows):
        truth[index, labels] = True
    old_negative = probabilities[:, :LABELS][~truth].mean()
    new_negative = probabilities[:, ids].mean(dim=0)
    assert ((new_negative / old_negative) < 3).all() and ((new_negative / old_negative) > 1 / 3).all(), (
        new_negative,
        old_negative,
    )
    old_positive = probabilities[:, :LABELS][truth].mean()
    for new_id, text in zip(ids, NEW_TEXTS):
        new_positive = torch.sigmoid(scores(model, tokenizer, planted_with(new_id, text))[:, new_id]).mean()
        assert 1 / 3 < new_positive / old_positive < 3, (new_positive, old_positive)


def test_the_offsets_solve_the_mass_they_aim_at():
    torch.manual_seed(0)
    scores_on_reference = torch.randn(500, 6, dtype=torch.float64) * 3 - 2
    moves = 1 + 0.1 * torch.rand(500, 6, dtype=torch.float64)
    target = torch.tensor([0.5, 1.0, 5.0, 20.0, 100.0, 400.0], dtype=torch.float64).log()
    offsets = priors.solve_offsets(lambda labels: (scores_on_reference[:, labels], moves[:, labels]), target)
    mass = torch.sigmoid(scores_on_reference + offsets * moves).sum(dim=0)
    torch.testing.assert_close(mass.log(), target, atol=1e-6, rtol=0)


def test_the_ridge_map_recovers_a_linear_map_and_picks_a_small_penalty():
    torch.manual_seed(0)
    inputs = torch.randn(300, 8)
    truth = torch.randn(8, 5)
    text_map = priors.RidgeFitter(inputs).fit(inputs @ truth + 0.5)
    fresh = torch.randn(20, 8)
    torch.testing.assert_close(text_map(fresh).float(), fresh @ truth + 0.5, atol=1e-2, rtol=1e-2)
    assert text_map.penalty < 0.01 * inputs.shape[0]


def test_the_expected_mass_is_the_nearest_trained_labels_mean_log_mass():
    """Each new text takes the mean log-mass of the `NEAREST_LABELS` trained texts most similar to it, not a
    regression toward every label's mean."""
    torch.manual_seed(0)
    centres = torch.randn(2, 16) * 3
    label_x = torch.cat([centres[0] + torch.randn(40, 16) * 0.1, centres[1] + torch.randn(40, 16) * 0.1])
    log_masses = torch.cat([torch.full((40,), -6.0), torch.full((40,), 2.0)])
    new_x = torch.stack([centres[0], centres[1]]) + torch.randn(2, 16) * 0.1
    torch.testing.assert_close(
        priors.nearest_log_masses(label_x, log_masses, new_x), torch.tensor([-6.0, 2.0]), atol=1e-6, rtol=0
    )


def test_the_mass_of_a_trained_label_counts_its_false_positives():
    """`label_masses` sums `p (1 - p)`: a label sure of its positives (p near 1) puts nothing on texts without it."""
    from haste_hf.modeling.output_layer import HasteOutputLayer

    torch.manual_seed(0)
    layer = HasteOutputLayer(8, 12, 4, 4, 4).eval()
    reference = torch.randn(30, 8)
    probabilities = torch.sigmoid(layer.logits(reference).float().double())
    expected = (probabilities * (1 - probabilities)).sum(dim=0)
    torch.testing.assert_close(priors.label_masses(layer, reference)[1], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(priors.label_masses(layer, reference)[0], probabilities.sum(dim=0), atol=1e-5, rtol=1e-5)


def test_the_balanced_offsets_make_the_bce_over_the_training_texts_stationary():
    """With examples, a label's bias is where `density * mean_examples p + (1 - density) * mean_negatives p` is
    `density`: its examples stand for the fraction `density` of the training texts that carries it."""
    torch.manual_seed(0)
    negative_scores = torch.randn(300, 4, dtype=torch.float64) * 2 - 1
    labels = torch.tensor([0, 1, 1, 2, 2, 2, 2, 2, 3])
    example_scores = torch.randn(labels.numel(), dtype=torch.float64) * 2 + 1
    density = torch.tensor([1e-3, 1e-2, 0.05, 0.2], dtype=torch.float64)
    offsets = priors.balanced_offsets(negative_scores, example_scores, labels, density)
    on_examples = torch.zeros(4, dtype=torch.float64).index_add(
        0, labels, torch.sigmoid(example_scores + offsets[labels])
    )
    on_examples /= torch.bincount(labels, minlength=4)
    on_negatives = torch.sigmoid(negative_scores + offsets).mean(dim=0)
    torch.testing.assert_close(density * on_examples + (1 - density) * on_negatives, density, atol=1e-9, rtol=1e-6)


MODES = {  # issue 36's modes: `add_labels` options of each
    "text": lambda: {},
    "text and negatives": lambda: {"negatives": negatives(), "fit_steps": 0},
    "text, fitted on negatives": lambda: {"negatives": negatives()},
    "text and 1 example": lambda: {"negatives": negatives(), "examples": mode_examples(1)},
    "text and 5 examples": lambda: {"negatives": negatives(), "examples": mode_examples(5)},
}


def mode_examples(count):
    return [planted_with(100 + index, text)[:count] for index, text in enumerate(NEW_TEXTS)]


def precision_at(model, tokenizer, rows, k):
    """P@k of the full ranking over every label of `model` on `(text, labels)` rows."""
    top = scores(model, tokenizer, [text for text, _ in rows]).topk(k, dim=1).indices
    return sum(len(set(ids.tolist()) & set(labels)) for ids, (_, labels) in zip(top, rows)) / (k * len(rows))


@pytest.mark.parametrize("head, raised", [(False, False), (None, False), (None, True)])
@pytest.mark.parametrize("mode", list(MODES))
def test_adding_labels_never_lowers_the_full_rankings_precision(trained, tokenizer, mode, head, raised, monkeypatch):
    """Issue 36 item 1 on planted texts (old labels' texts, and texts that also plant a new label's words, which
    carry it): P@1 and P@5 of the full ranking over old and new labels after adding are at least what they were
    before, in every mode and placement. In the head (the default here), still so with every new label's level
    raised 10 logits (an uncalibrated level, or a fit sure of itself), which the rank cap (`rank_caps.py`) brings
    back, and the check catches the cap missing: the raised levels uncapped put new labels atop old texts in every
    mode. (Raised in the tail, new labels take 2 of these 78 texts' tops with negatives: the cap bounds the count
    on the 200 negatives, and fresh texts see about one entry in `n + 1` more than it allows; from text alone,
    capped on label names, most of them.)"""
    rows = planted(list(range(LABELS)), 60, seed=7)
    ids = list(range(LABELS, LABELS + len(NEW_TEXTS)))
    for new_id, text in zip(ids, NEW_TEXTS):
        rows += [
            (row, [*labels, new_id])
            for row, labels in planted(list(range(LABELS)), 6, seed=50 + new_id, extra=text.split())
        ]
    before = [precision_at(trained, tokenizer, rows, k) for k in (1, 5)]
    if raised:
        for name in ("solve_offsets", "balanced_offsets"):
            solve = getattr(priors, name)
            monkeypatch.setattr(priors, name, lambda *args, solve=solve, **kwargs: solve(*args, **kwargs) + 10)
    model, _ = added(trained, tokenizer, head=head, **MODES[mode]())
    after = [precision_at(model, tokenizer, rows, k) for k in (1, 5)]
    assert after[0] >= before[0] and after[1] >= before[1], (before, after)
    if raised:  # the same levels uncapped
        monkeypatch.setattr(priors, "rank_caps", lambda scores, *_: torch.zeros(scores.shape[1], dtype=torch.float64))
        model, _ = added(trained, tokenizer, head=head, **MODES[mode]())
        assert precision_at(model, tokenizer, rows, 1) < before[0]
