"""`haste-hf train --encoder <SentenceTransformer folder>` keeps the folder's pooling and normalisation, as
`from_encoder_pretrained` does: the command line read the transformer alone (mean pooling, no normalisation)."""

import json

import faults
import pytest
import torch
from launch import run_cli, train_flags
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.normalize import Normalize
from sentence_transformers.base.modules.transformer import Transformer
from sentence_transformers.sentence_transformer.modules.pooling import Pooling
from tiny_encoders import HIDDEN

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
    # The folder's pooling; its Normalize is left out (the recipe's learning rates are for unnormalised features).
    assert encoder_pooling(str(cls_normalize_folder), encoder) == ("cls", False)
    assert encoder_pooling(str(cls_normalize_folder), encoder, "mean") == ("mean", False)  # --pooling wins
    plain, _ = load_encoder(str(encoder_dir))
    assert encoder_pooling(str(encoder_dir), plain) == ("mean", False)  # a plain transformers folder: its family's
    assert torch.equal(encoder.embeddings.word_embeddings.weight, plain.embeddings.word_embeddings.weight)


def test_train_keeps_the_folders_pooling(capsys, cli_files, cls_normalize_folder, tmp_path):
    output = tmp_path / "out"
    status, lines = run_cli(
        capsys, train_flags(cli_files["data"], cls_normalize_folder, output, "--validation-fraction", "0")
    )
    assert status == 0, lines
    config = json.loads((output / "config.json").read_text())
    assert (config["pooling"], config["normalize"]) == ("cls", False)
