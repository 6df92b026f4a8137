"""What a user of transformers' training conventions gets with a HASTE model, as with a transformers classifier: a
stock `TrainingArguments` (`remove_unused_columns=True`) over raw text, `DataCollatorWithPadding` over tokenized text
with ragged label-id lists, and the metric from `evaluate.load`; and what a stock `Trainer` needs (`XMCDataCollator`),
as the README says."""

from pathlib import Path

import evaluate
import numpy as np
import pytest
from datasets import Dataset
from tiny_encoders import planted_texts
from tiny_haste import make_tiny_model
from transformers import DataCollatorWithPadding, Trainer, TrainingArguments

from haste_hf import HasteTrainer, HasteTrainingArguments, XMCDataCollator
from haste_hf.metrics import compute_xmc_metrics


LABELS = 40
README = Path(__file__).parents[2] / "README.md"


def texts(size, seed):
    """Raw text, ragged label-id lists, and a column the model does not take."""
    return Dataset.from_list([{**row, "source": f"doc {i}"} for i, row in enumerate(planted_texts(LABELS, size, seed))])


def stock_arguments(tmp_path, **fields):
    return TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=8,
        report_to=[],
        use_cpu=True,
        **fields,
    )


def test_a_stock_training_arguments_trains_on_raw_text(tmp_path, tokenizer):
    arguments = stock_arguments(tmp_path)
    assert arguments.remove_unused_columns  # transformers' default
    trainer = HasteTrainer(
        model=make_tiny_model(label_count=LABELS),
        args=arguments,
        train_dataset=texts(24, 0),
        processing_class=tokenizer,
    )
    assert trainer.args.remove_unused_columns
    assert trainer.train().global_step == 3
    batch = next(iter(trainer.get_train_dataloader()))  # the unused column is removed, the text was kept for tokenizing
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}


def test_data_collator_with_padding_pads_ragged_label_lists(tmp_path, tokenizer):
    tokenized = texts(24, 0).map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=16), batched=True)
    trainer = HasteTrainer(
        model=make_tiny_model(label_count=LABELS),
        args=stock_arguments(tmp_path),
        train_dataset=tokenized,
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    # What the Trainer hands the collator: the model's columns (the text columns are removed, as for any classifier).
    features = [tokenized.remove_columns(["text", "source"])[i] for i in range(8)]
    batch = trainer.data_collator(features)
    rows = [feature["labels"] for feature in features]
    assert len({len(row) for row in rows}) > 1  # ragged
    assert batch["labels"].shape == (8, max(len(row) for row in rows))
    assert [[label for label in row if label != -100] for row in batch["labels"].tolist()] == rows
    assert batch["input_ids"].shape[0] == 8
    assert trainer.train().global_step == 3


def test_haste_training_arguments_with_data_collator_with_padding(tmp_path, tokenizer):
    """`HasteTrainingArguments` keeps every column (for `XMCDataCollator`, which tokenizes the text): the raw text
    left beside the tokens goes past `DataCollatorWithPadding`; untokenized examples are refused in one line."""
    tokenized = texts(24, 0).map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=16), batched=True)
    arguments = HasteTrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8, report_to=[], use_cpu=True
    )
    assert not arguments.remove_unused_columns
    trainer = HasteTrainer(
        model=make_tiny_model(label_count=LABELS),
        args=arguments,
        train_dataset=tokenized,
        data_collator=DataCollatorWithPadding(tokenizer),
    )
    assert trainer.train().global_step == 2
    raw = [texts(2, 0)[i] for i in range(2)]
    with pytest.raises(ValueError, match=r"no `input_ids`.*haste_hf.XMCDataCollator\(tokenizer\)"):
        trainer.data_collator(raw)


def test_evaluate_load_finds_the_metric(tmp_path, tokenizer):
    from haste_hf.metrics import EVALUATE_METRIC_PATH

    metric = evaluate.load(EVALUATE_METRIC_PATH, ks=(1, 3))
    predictions = [[3, 1, 2], [0, 5, 4]]
    references = [[1, -100], [4, 7]]
    expected = compute_xmc_metrics(np.array(predictions), [[1], [4, 7]], ks=(1, 3))
    assert metric.compute(predictions=predictions, references=references) == pytest.approx(expected)

    # As the `compute_metrics` of a Trainer: the model's top-k ids against the padded label ids.
    def compute_metrics(prediction):
        top_ids = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        return metric.compute(predictions=top_ids, references=prediction.label_ids)

    trainer = HasteTrainer(
        model=make_tiny_model(label_count=LABELS),
        args=stock_arguments(tmp_path, per_device_eval_batch_size=8),
        eval_dataset=texts(16, 1),
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    scores = trainer.evaluate()
    assert {"eval_P@1", "eval_P@3", "eval_nDCG@3"} <= set(scores) and 0 <= scores["eval_P@1"] <= 1


def tokenized(tokenizer, rows):
    return Dataset.from_list(rows).map(
        lambda batch: tokenizer(batch["text"], truncation=True, max_length=16), batched=True, remove_columns=["text"]
    )


def stock_trainer_paragraph():
    readme = " ".join(README.read_text().split())
    paragraph = readme[readme.index("A stock `transformers.Trainer` trains") :]
    return paragraph[: paragraph.index("```")]


@pytest.mark.parametrize(
    "processing, collator, message",
    [
        (False, "default_data_collator", "expected sequence of length"),
        (True, "DataCollatorWithPadding", "Unable to create tensor"),
    ],
)
def test_a_stock_trainer_needs_xmc_data_collator_as_the_readme_says(tmp_path, tokenizer, processing, collator, message):
    """A stock `Trainer` collates with transformers' own collator (chosen by the type of `processing_class` alone,
    before any of the model's code runs), which fails on label-id lists of different lengths; the README names the
    error the user meets there and the fix, `XMCDataCollator`, which trains."""
    dataset = tokenized(tokenizer, planted_texts(LABELS, 24, 0, labels_per_text=3))
    assert len({len(row) for row in dataset["labels"][:8]}) > 1  # ragged in the first batch
    given = {"processing_class": tokenizer} if processing else {}
    trainer = Trainer(
        model=make_tiny_model(label_count=LABELS), args=stock_arguments(tmp_path), train_dataset=dataset, **given
    )
    with pytest.raises(ValueError) as failure:
        trainer.train()
    assert str(failure.value).startswith(message)
    paragraph = stock_trainer_paragraph()
    assert f"`{collator}`" in paragraph and f"`{message} ...`" in paragraph
    assert "`data_collator=XMCDataCollator(tokenizer)`" in paragraph

    trainer = Trainer(
        model=make_tiny_model(label_count=LABELS),
        args=stock_arguments(tmp_path),
        train_dataset=dataset,
        data_collator=XMCDataCollator(tokenizer, max_length=16),
        **given,
    )
    assert trainer.train().global_step == 3


def test_a_stock_trainer_left_without_tokens_is_told_of_xmc_data_collator(tmp_path, tokenizer):
    """Labels of one length collate, but a stock `TrainingArguments` removes the raw `text` (no argument of the model):
    the model names the collator that tokenizes it, not the encoder's complaint about missing `input_ids`."""
    raw = Dataset.from_list(planted_texts(LABELS, 16, 0, labels_per_text=1))
    trainer = Trainer(model=make_tiny_model(label_count=LABELS), args=stock_arguments(tmp_path), train_dataset=raw)
    with pytest.raises(
        ValueError, match=r"got no `input_ids`.*haste_hf.XMCDataCollator\(tokenizer\).*remove_unused_columns"
    ):
        trainer.train()


def test_a_stock_trainer_given_one_label_id_per_text_is_told_of_xmc_data_collator(tmp_path, tokenizer):
    """A `label` column of one id per text collates (transformers' collators name it `labels`) as a `[B]` vector,
    which the model refuses in one line naming the form it takes and `XMCDataCollator`, which packs id lists so."""
    rows = [{"text": row["text"], "label": row["labels"][0]} for row in planted_texts(LABELS, 16, 0, labels_per_text=1)]
    trainer = Trainer(
        model=make_tiny_model(label_count=LABELS),
        args=stock_arguments(tmp_path),
        train_dataset=tokenized(tokenizer, rows),
        processing_class=tokenizer,
    )
    with pytest.raises(ValueError, match=r"must be 2-D with one row per example, got shape \(8,\).*XMCDataCollator"):
        trainer.train()
