"""Labels added to a trained model rank among the others (`haste_hf/labels/priors.py`): the text map puts a new
label where its words are, the calibration puts its scores on the old labels' level, so the old labels' rankings
stay where they were on texts without the new labels' words.

The model: a tiny random encoder, frozen, and an output layer trained on its features of planted texts (label l
planted as word `w{l}` among noise words), named by its words, as `haste-hf train` names a model by its label texts.
"""

import random

import pytest
import torch
from tiny_encoders import WORDS, tiny_tokenizer
from tiny_haste import make_tiny_model

from haste_hf.labels import priors
from haste_hf.labels.additions import embed_texts


LABELS = 38
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


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def trained(tokenizer):
    """`(model, plain texts, their labels)`: the output layer trained on the frozen encoder's features."""
    model = make_tiny_model(label_count=LABELS, head_label_count=4, group_size=4, fan_in=16, shuffle_labels=True)
    model.eval()
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
    import copy

    model = copy.deepcopy(trained)
    ids = model.add_labels(NEW_TEXTS, tokenizer=tokenizer, names=[f"new {i}" for i in range(len(NEW_TEXTS))], **options)
    return model, ids


@pytest.mark.parametrize("negatives", [False, True])
def test_old_rankings_keep_their_top_and_a_new_label_tops_the_texts_of_its_words(trained, tokenizer, negatives):
    old_texts = [text for text, _ in planted(list(range(LABELS)), 60, seed=7)]
    before = scores(trained, tokenizer, old_texts)
    options = {"negatives": [text for text, _ in planted(list(range(LABELS)), 200, seed=9)]} if negatives else {}
    model, ids = added(trained, tokenizer, **options)
    after = scores(model, tokenizer, old_texts)
    assert torch.equal(after[:, :LABELS], before)
    assert torch.equal(after.argmax(dim=1), before.argmax(dim=1))  # no new label tops a text without its words
    for new_id, text in zip(ids, NEW_TEXTS):
        texts = [text for text, _ in planted(list(range(LABELS)), 12, seed=new_id, extra=text.split())]
        assert (scores(model, tokenizer, texts).argmax(dim=1) == new_id).all()


def test_new_scores_sit_on_the_old_labels_level(trained, tokenizer):
    """On texts without a label's words, a new label's mean sigmoid score is what an old label's is on texts without
    its word (within a factor of 3); where its words are, it scores as an old label does on its own word's texts.
    Scores left uncalibrated (the fitted offsets 10x, or none) fail it."""
    model, ids = added(trained, tokenizer)
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
        texts = [text for text, _ in planted(list(range(LABELS)), 12, seed=new_id, extra=text.split())]
        new_positive = torch.sigmoid(scores(model, tokenizer, texts)[:, new_id]).mean()
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


def test_the_balanced_offsets_make_the_scores_on_known_texts_sum_to_the_positives_count():
    """With negatives, a new label's bias is where its BCE is stationary on its positives and the negatives: its
    scores summed over them are its positives' count, so the negatives get the mass its positives miss, no more."""
    torch.manual_seed(0)
    negative_scores = torch.randn(300, 4, dtype=torch.float64) * 2 - 1
    positive_labels = torch.tensor([0, 1, 1, 2, 2, 2, 2, 2, 3])
    positive_scores = torch.randn(positive_labels.numel(), dtype=torch.float64) * 2 + 1
    offsets = priors.balanced_offsets(negative_scores, positive_scores, positive_labels)
    mass = torch.sigmoid(negative_scores + offsets).sum(dim=0)
    mass = mass.index_add(0, positive_labels, torch.sigmoid(positive_scores + offsets[positive_labels]))
    torch.testing.assert_close(mass, torch.tensor([1.0, 2.0, 5.0, 1.0], dtype=torch.float64), atol=1e-6, rtol=0)
    # The negatives take less than the positives' count: what the positives miss.
    negative_mass = torch.sigmoid(negative_scores + offsets).sum(dim=0)
    assert (negative_mass < torch.tensor([1.0, 2.0, 5.0, 1.0], dtype=torch.float64)).all()
