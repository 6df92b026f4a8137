"""Train HASTE on a dataset downloaded from the Extreme Classification Repository.

Download and unpack a dataset first, e.g. LF-AmazonTitles-131K (raw text: `trn.json.gz`, `tst.json.gz`,
`lbl.json.gz`, `filter_labels_test.txt`) or AmazonTitles-670K (`trn_X.txt`, `trn_X_Y.txt`, `Y.txt`, ...),
then:

    python examples/train_xmc_repository.py --data /data/LF-AmazonTitles-131K --encoder sentence-transformers/all-mpnet-base-v2

The same run from the command line is `haste-hf train --data ... --encoder ...`; this script shows the
steps so you can change any of them: label embeddings and semantic groups are computed once and saved,
the tail is rewired during training, and the test set (with its filter file, if any) is only used at the end.
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

from haste_hf import HasteForExtremeClassification
from haste_hf.data import XMCDataCollator, label_frequencies, load_xmc_dataset
from haste_hf.grouping import LabelGrouping, compute_label_embeddings, group_labels, split_head_tail
from haste_hf.metrics import Propensity, compute_xmc_metrics, filter_top_k, make_compute_metrics, max_filtered_per_point
from haste_hf.trainer import HasteTrainer
from haste_hf.training_args import HasteTrainingArguments


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", required=True, help="Folder of the downloaded dataset.")
parser.add_argument("--encoder", default="sentence-transformers/all-mpnet-base-v2")
parser.add_argument("--output-dir", default="haste-xmc")
parser.add_argument("--epochs", type=float, default=10)
parser.add_argument("--group-size", type=int, default=32)
parser.add_argument("--fan-in", type=int, default=128)
args = parser.parse_args()

data = load_xmc_dataset(args.data, text_fields="title")
split = data.splits["train"].train_test_split(test_size=0.02, seed=0)  # validation for model selection
train, validation = split["train"], split["test"]
frequencies = label_frequencies(train, data.num_labels)
propensity = Propensity.from_frequencies(frequencies, len(train), dataset_name=Path(args.data).name)
print(f"{data.num_labels:,} labels; PSP with A={propensity.a}, B={propensity.b}")

tokenizer = AutoTokenizer.from_pretrained(args.encoder)
encoder = AutoModel.from_pretrained(args.encoder, dtype=torch.float32)
head_ids, tail_ids = split_head_tail(frequencies, head_fraction=0.03)

grouping_file = Path(args.output_dir) / "grouping.safetensors"
if grouping_file.exists():
    grouping = LabelGrouping.load(str(grouping_file))
else:
    embeddings = compute_label_embeddings(
        encoder, train["text"], train["labels"], data.num_labels, tokenizer=tokenizer, batch_size=256, pooling="mean"
    )
    grouping = group_labels(embeddings, tail_ids, group_size=args.group_size, strategy="semantic", beta=16)
    grouping_file.parent.mkdir(parents=True, exist_ok=True)
    grouping.save(str(grouping_file))

model = HasteForExtremeClassification.from_encoder_pretrained(
    encoder, data.num_labels, label_frequencies=frequencies, label_grouping=grouping, label_names=data.label_texts,
    head_label_count=len(head_ids), group_size=args.group_size, fan_in=args.fan_in,
)  # fmt: skip
bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
trainer = HasteTrainer(
    model=model,
    args=HasteTrainingArguments(
        output_dir=args.output_dir, num_train_epochs=args.epochs, per_device_train_batch_size=128,
        per_device_eval_batch_size=256, learning_rate=5e-5, warmup_steps=0.05, output_learning_rate=0.05,
        output_momentum=0.9, bf16=bf16, output_layer_dtype="bfloat16" if bf16 else None,
        rewiring_interval=2000, rewiring_fraction=0.2, eval_strategy="epoch", save_strategy="epoch",
        load_best_model_at_end=True, metric_for_best_model="P@1", save_total_limit=2, logging_steps=100,
        report_to=[],
    ),  # fmt: skip
    train_dataset=train,
    eval_dataset=validation,
    data_collator=XMCDataCollator(tokenizer, max_length=32),
    compute_metrics=make_compute_metrics(propensity=propensity),
)
trainer.train()

# Test: top-k with the repository's filter file applied before ranking, as the standard tools do.
test = data.splits["test"]
filters = (data.filters or {}).get("test")
k = 5 + (max_filtered_per_point(filters) if filters is not None else 0)
model.eval()
top_ids = []
for start in range(0, len(test), 256):
    batch = tokenizer(test[start : start + 256]["text"], truncation=True, max_length=32, padding=True, return_tensors="pt")
    top_ids.append(model.predict_topk(**batch.to(model.device), k=k).label_ids.cpu())
top_ids = torch.cat(top_ids).numpy()
if filters is not None:
    top_ids = filter_top_k(top_ids, filters, k=5)
print(compute_xmc_metrics(top_ids, test["labels"], ks=(1, 3, 5), propensity=propensity))
trainer.save_model(args.output_dir)
tokenizer.save_pretrained(args.output_dir)
