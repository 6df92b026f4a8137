"""`haste-hf train --encoder <SentenceTransformer folder>` keeps the folder's pooling and normalisation, as
`from_encoder_pretrained` does (the command line read the transformer alone, then dropped the Normalize without a
word); the normalised features are scaled to the encoder's own mean norm on the training texts (`feature_norm`), the
scale the recipe's output learning rates are set for."""

import json

import faults
import pytest
import torch
from faults import CLI_LABELS
from launch import run_cli, train_flags
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling
from tiny_encoders import HIDDEN, planted_texts

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.recipe import encoder_pooling, load_encoder


cli_files = faults.cli_files  # the fixture: datasets of 30, 40 and 20 labels, a saved model, texts


@pytest.fixture(scope="module")
def cls_normalize_folder(encoder_dir, tmp_path_factory):
    """A SentenceTransformer folder: the tiny BERT, CLS pooling, Normalize."""
    folder = tmp_path_factory.mktemp("st") / "cls-normalize"
    modules = [Transformer(str(encoder_dir), max_seq_length=16), Pooling(HIDDEN, pooling_mode="cls"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def test_the_recipe_reads_a_sentence_transformer_folder_as_the_api_does(cls_normalize_folder, encoder_dir):
    encoder, _ = load_encoder(str(cls_normalize_folder))
    api = HasteForExtremeClassification.from_encoder_pretrained(str(cls_normalize_folder), 30, fan_in=8)
    assert (
        encoder_pooling(str(cls_normalize_folder), encoder)
        == ("cls", True)
        == (api.config.pooling, api.config.normalize)
    )
    assert encoder_pooling(str(cls_normalize_folder), encoder, "mean") == ("mean", True)  # --pooling wins
    plain, _ = load_encoder(str(encoder_dir))
    assert encoder_pooling(str(encoder_dir), plain) == ("mean", False)  # a plain transformers folder: its family's
    assert torch.equal(encoder.embeddings.word_embeddings.weight, plain.embeddings.word_embeddings.weight)


def test_train_keeps_the_folders_pooling_and_normalisation(capsys, cli_files, cls_normalize_folder, tmp_path):
    output = tmp_path / "out"
    status, lines = run_cli(
        capsys, train_flags(cli_files["data"], cls_normalize_folder, output, "--validation-fraction", "0")
    )
    assert status == 0, lines
    config = json.loads((output / "config.json").read_text())
    assert (config["pooling"], config["normalize"]) == ("cls", True)
    # Scaled to the encoder's own mean norm on the training texts, and served so.
    encoder, tokenizer = load_encoder(str(cls_normalize_folder))
    texts = [row["text"] for row in planted_texts(CLI_LABELS, 40, seed=0)]  # the training split's texts
    batch = tokenizer(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():
        states = encoder(**batch).last_hidden_state[:, 0]
    assert config["feature_norm"] == pytest.approx(float(states.norm(dim=1).mean()), rel=0.2)
    assert config["feature_norm"] > 1.5  # the tiny BERT's CLS states: far from unit norm
    model = HasteForExtremeClassification.from_pretrained(output).eval()
    with torch.no_grad():
        pooled, _ = model.encode(batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(pooled.norm(dim=1), torch.full((len(texts),), config["feature_norm"]))


def test_feature_norm_is_refused_without_normalisation_and_needs_format_4():
    config = HasteConfig(normalize=True, feature_norm=4.2, label_count=30, fan_in=8)
    assert config.to_dict()["format_version"] == 4
    assert HasteConfig(normalize=True, label_count=30, fan_in=8).to_dict()["format_version"] == 3
    for bad in (0, -1.0, float("nan"), float("inf"), True, "4"):
        with pytest.raises(ValueError, match="`feature_norm` must be a positive finite number"):
            HasteConfig(normalize=True, feature_norm=bad, label_count=30, fan_in=8)
    with pytest.raises(ValueError, match="set `normalize=True`"):
        HasteConfig(feature_norm=4.2, label_count=30, fan_in=8)
