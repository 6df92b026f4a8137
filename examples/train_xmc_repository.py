"""Train HASTE on a dataset of the Extreme Classification Repository, read from a folder.

This script downloads nothing. Download a dataset by hand from the repository's page
(http://manikvarma.org/downloads/XC/XMLRepository.html, links to each dataset's files) and unpack it into a folder,
e.g. LF-AmazonTitles-131K (raw text: `trn.json.gz`, `tst.json.gz`, `lbl.json.gz`, `filter_labels_test.txt`) or
AmazonTitles-670K (`trn_X.txt`, `trn_X_Y.txt`, `Y.txt`, ...), then:

    python examples/train_xmc_repository.py --data /data/LF-AmazonTitles-131K --encoder sentence-transformers/all-mpnet-base-v2

The same run from the command line is `haste-hf group` then `haste-hf train --layout-file ...`. The label
layout (head/tail split and semantic groups of the training split) is computed once and saved, so a second
run skips the label embeddings; it is checked against the training split before use. The tail is rewired
during training, a 2% validation hold-out selects the best epoch, and the test set (with its filter file, if
any) is only used at the end.
"""

import argparse
from pathlib import Path

import torch

from haste_hf.labels.layout import LabelLayout
from haste_hf.recipe import build_layout, load_dataset, load_encoder, split_validation, train


parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--data", required=True, help="Folder of the dataset, downloaded and unpacked by hand.")
parser.add_argument("--encoder", default="sentence-transformers/all-mpnet-base-v2")
parser.add_argument("--output-dir", default="haste-xmc")
parser.add_argument("--epochs", type=float, default=10)
parser.add_argument("--group-size", type=int, default=32)
parser.add_argument("--fan-in", type=int, default=128)
args = parser.parse_args()

VALIDATION_FRACTION, SEED, MAX_LENGTH = 0.02, 0, 32
data = load_dataset(args.data, text_fields="title")

layout_file = Path(args.output_dir) / "label_layout.safetensors"
if not layout_file.exists():
    train_split, _ = split_validation(data.splits["train"], VALIDATION_FRACTION, SEED)
    encoder, tokenizer = load_encoder(args.encoder)
    layout = build_layout(
        train_split,
        data.label_count,
        encoder,
        tokenizer,
        group_size=args.group_size,
        seed=SEED,
        max_length=MAX_LENGTH,
        batch_size=256,
    )
    layout.save(layout_file)
print(LabelLayout.load(layout_file).describe())

bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
run = train(
    data,
    args.encoder,
    args.output_dir,
    layout_file=str(layout_file),
    fan_in=args.fan_in,
    validation_fraction=VALIDATION_FRACTION,
    max_length=MAX_LENGTH,
    dataset_name=Path(args.data).name,
    training_args={
        "num_train_epochs": args.epochs,
        "per_device_train_batch_size": 128,
        "per_device_eval_batch_size": 256,
        "learning_rate": 5e-5,
        "warmup_steps": 0.05,
        "output_learning_rate": 0.05,
        "output_momentum": 0.9,
        "bf16": bf16,
        "output_layer_dtype": "bfloat16" if bf16 else None,
        "rewiring_interval": 2000,
        "rewiring_fraction": 0.2,
        "save_total_limit": 2,
        "logging_steps": 100,
        "seed": SEED,
    },
)
print(f"PSP with A={run.propensity.a}, B={run.propensity.b}")
print(run.test_metrics)
