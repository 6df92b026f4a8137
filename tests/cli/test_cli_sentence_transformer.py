"""`haste-hf train --encoder <SentenceTransformer folder>` reads the folder as `from_encoder_pretrained` does: its
pooling, its Normalize left out with a one-line warning (the command line read the transformer alone before, mean
pooling; the API kept the Normalize, without a word that the two differed)."""

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
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from haste_hf import HasteForExtremeClassification
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
    assert encoder_pooling(str(cls_normalize_folder), encoder) == "cls"  # the folder's pooling
    assert encoder_pooling(str(cls_normalize_folder), encoder, "mean") == "mean"  # --pooling wins
    plain, _ = load_encoder(str(encoder_dir))
    assert encoder_pooling(str(encoder_dir), plain) == "mean"  # a plain transformers folder: its family's
    assert torch.equal(encoder.embeddings.word_embeddings.weight, plain.embeddings.word_embeddings.weight)


def test_train_and_the_api_read_the_folder_into_the_same_config_and_say_so_once(
    capsys, cli_files, cls_normalize_folder, tmp_path
):
    output = tmp_path / "out"
    with CaptureLogger(logging.get_logger("transformers.haste_hf")) as captured:
        status, lines = run_cli(
            capsys, train_flags(cli_files["data"], cls_normalize_folder, output, "--validation-fraction", "0")
        )
    assert status == 0, lines
    assert [line for line in captured.out.splitlines() if "Normalize" in line] == [
        f"The SentenceTransformer in {cls_normalize_folder} ends in a Normalize module, left out: HASTE fine-tunes the "
        "encoder, and unit-norm features trained 4.2 PSP@5 worse on deps (benchmarks/results/normalize_2026-11-27)."
    ]
    trained = json.loads((output / "config.json").read_text())
    api = HasteForExtremeClassification.from_encoder_pretrained(str(cls_normalize_folder), 30, fan_in=8).config
    assert (trained["pooling"], trained["normalize"]) == (api.pooling, api.normalize) == ("cls", False)
    assert trained["encoder"]["hidden_size"] == api.encoder.hidden_size == HIDDEN
