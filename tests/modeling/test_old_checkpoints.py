"""Checkpoints of formats 1 and 2 (the output layer's tensors named `head.*`, `tail.*`, `output_labels`), as
the code of that time saved them (tests/fixtures/make_old_checkpoints.py), load with the package and with
their own exported code, score as they did, and save again in the current format; so does a model that kept a
SentenceTransformer's Normalize (`normalize` true), which `from_encoder_pretrained` now leaves out."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from haste_hf import HASTE_FORMAT_VERSION, HasteForExtremeClassification


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
OLD_FORMATS = [1, 2]


def old_folder(format_version: int, tmp_path) -> str:
    folder = tmp_path / f"format_{format_version}"
    shutil.copytree(os.path.join(FIXTURES, f"format_{format_version}"), folder)
    assert json.loads((folder / "config.json").read_text())["format_version"] == format_version
    assert "tail.supports" in load_file(folder / "model.safetensors")  # as the old code wrote it
    return str(folder)


# The logits are float32 sums whose rounding depends on the CPU's vector width (one ulp or two between machines):
# compared within float32's tolerance; the top-k ids, far apart in score, are compared exactly.
LOGIT_TOLERANCE = dict(rtol=1.3e-6, atol=1e-5)


def assert_scores_as_saved(model, expected: dict):
    with torch.no_grad():
        output = model(expected["input_ids"], expected["attention_mask"], labels=expected["labels"], return_logits=True)
        top = model.predict_topk(expected["input_ids"], expected["attention_mask"], k=5)
    torch.testing.assert_close(output.logits, expected["logits"], **LOGIT_TOLERANCE)
    torch.testing.assert_close(output.loss, expected["loss"], rtol=1e-6, atol=1e-6)
    assert torch.equal(top.label_ids, expected["top_label_ids"])


@pytest.mark.parametrize("format_version", OLD_FORMATS)
def test_old_checkpoint_loads_scores_as_saved_and_saves_in_the_current_format(format_version, tmp_path):
    folder = old_folder(format_version, tmp_path)
    expected = torch.load(os.path.join(folder, "expected.pt"))
    model, info = HasteForExtremeClassification.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.normalize is (format_version == 2)
    assert model.label_names[29] == "label 29"
    assert_scores_as_saved(model.eval(), expected)
    assert_scores_as_saved(AutoModel.from_pretrained(folder).eval(), expected)

    model.save_pretrained(tmp_path / "again")
    saved = load_file(tmp_path / "again" / "model.safetensors")
    assert "output_layer.tail.supports" in saved and not any(
        name.startswith(("head.", "tail.", "output_labels")) for name in saved
    )
    assert json.loads((tmp_path / "again" / "config.json").read_text())["format_version"] == HASTE_FORMAT_VERSION
    assert_scores_as_saved(HasteForExtremeClassification.from_pretrained(tmp_path / "again").eval(), expected)


@pytest.mark.parametrize("format_version", OLD_FORMATS)
def test_old_checkpoint_loads_with_its_own_code_without_the_package(format_version, tmp_path):
    assert_own_code_scores_as_saved(old_folder(format_version, tmp_path), tmp_path)


def assert_own_code_scores_as_saved(folder, tmp_path):
    """The folder's exported code, without the package installed, scores its `expected.pt` batch as saved."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["haste_hf"] = None  # as if the package were not installed
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained({folder!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        expected = torch.load({os.path.join(folder, "expected.pt")!r})
        with torch.no_grad():
            out = model(expected["input_ids"], expected["attention_mask"], labels=expected["labels"], return_logits=True)
            top = model.predict_topk(expected["input_ids"], expected["attention_mask"], k=5)
        torch.testing.assert_close(out.logits, expected["logits"], **{LOGIT_TOLERANCE!r})
        assert torch.equal(top.label_ids, expected["top_label_ids"])
        """
    )
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]


# A model `from_encoder_pretrained` built from a SentenceTransformer folder ending in a Normalize before issue 40 (it
# kept the Normalize; now left out), as that code saved it (tests/fixtures/make_normalizing_sentence_transformer_model.py).
NORMALIZING = "normalizing_sentence_transformer"


def test_a_model_that_kept_a_sentence_transformers_normalize_loads_and_scores_as_saved(tmp_path):
    folder = tmp_path / NORMALIZING
    shutil.copytree(os.path.join(FIXTURES, NORMALIZING), folder)
    expected = torch.load(folder / "expected.pt")
    model = HasteForExtremeClassification.from_pretrained(folder)
    assert (model.config.normalize, model.config.pooling) == (True, "mean")
    assert_scores_as_saved(model.eval(), expected)
    assert_scores_as_saved(AutoModel.from_pretrained(folder).eval(), expected)
    model.save_pretrained(tmp_path / "again")  # saved again, it keeps its features
    assert json.loads((tmp_path / "again" / "config.json").read_text())["normalize"] is True
    assert_scores_as_saved(HasteForExtremeClassification.from_pretrained(tmp_path / "again").eval(), expected)
