"""The README's Python examples run as written, with a tiny encoder in place of MiniLM and a few steps."""

import re
from pathlib import Path

import pytest
import torch
from tiny_encoders import tiny_encoder_config, tiny_tokenizer
from tiny_haste import make_tiny_model
from transformers import BertModel

from haste_hf import HasteForExtremeClassification


README = (Path(__file__).parent.parent / "README.md").read_text()


def example(heading: str) -> str:
    """The first Python block after `### {heading}`."""
    section = README.split(f"### {heading}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)


@pytest.fixture
def tiny_encoder(tmp_path):
    config = tiny_encoder_config("bert")
    config.max_position_embeddings = 160  # the demo texts, cut at the collator's 128 tokens
    BertModel(config).save_pretrained(tmp_path / "encoder")
    tiny_tokenizer(tmp_path / "encoder")
    return str(tmp_path / "encoder")


def run(code: str, cwd: Path, monkeypatch) -> dict:
    """The example's global names after it ran in `cwd`."""
    monkeypatch.chdir(cwd)
    namespace = {"__name__": "readme"}
    exec(compile(code, "README.md", "exec"), namespace)
    return namespace


def test_pipeline_example(tmp_path, tiny_encoder, monkeypatch, capsys):
    model = make_tiny_model(label_count=12, head_label_count=2)
    model.set_label_names([f"tag{i}" for i in range(12)])
    model.save_pretrained(tmp_path / "haste-demo")
    tiny_tokenizer(tmp_path / "haste-demo")
    run(example("Pipelines, stock `Trainer`, SentenceTransformers"), tmp_path, monkeypatch)
    printed = eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(printed) == 2 and all(len(row) == 3 and row[0]["label"].startswith("tag") for row in printed)


def test_peft_example(tmp_path, tiny_encoder, monkeypatch):
    code = example("LoRA with PEFT")
    for original, replacement in (
        ('"sentence-transformers/all-MiniLM-L6-v2"', repr(tiny_encoder)),
        ("num_train_epochs=1", "max_steps=2"),
        ("fan_in=64", "fan_in=8"),
    ):
        assert original in code
        code = code.replace(original, replacement)
    names = run(code, tmp_path, monkeypatch)
    assert (tmp_path / "haste-lora" / "adapter_config.json").exists()
    merged = HasteForExtremeClassification.from_pretrained(tmp_path / "haste-merged").eval()
    assert merged.config.label_count == 452
    input_ids = torch.randint(5, 100, (3, 7))
    with torch.no_grad():
        trained = names["trainer"].model.eval()(input_ids, return_logits=True).logits
        for model in (names["reloaded"].eval(), merged):
            torch.testing.assert_close(model(input_ids, return_logits=True).logits, trained, rtol=1e-5, atol=1e-5)


def test_output_layer_example(tmp_path, monkeypatch):
    names = run(example("The output layer on its own"), tmp_path, monkeypatch)
    layer, features, labels = names["layer"], names["features"], names["labels"]
    assert layer.head.weight.shape == (300, 384) and layer.tail.weight.shape == (607, 16, 64)
    assert names["top"].label_ids.shape == (8, 5) and names["logits"].shape == (8, 10_000)
    assert layer.tail.weight.grad is not None and layer.head.weight.grad is not None
    reference = layer.reference_loss(layer.position_logits(features), labels)
    torch.testing.assert_close(names["loss"], reference, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(names["top"].scores, names["logits"].topk(5).values, rtol=1e-5, atol=1e-5)
