"""`group` and `train --layout-file` hold out the same seeded validation points: mutation testing changed the
seed or the fraction of one of them without a test noticing (no test ran both with a non-zero fraction)."""

import torch

from haste_hf import HasteForExtremeClassification
from haste_hf.cli import main
from haste_hf.labels.layout import LabelLayout


def common(dataset_dir):
    return ["--data", str(dataset_dir), "--max-length", "6", "--eval-batch-size", "16"]


def test_group_and_train_hold_out_the_same_seeded_validation_points(dataset_dir, encoder_dir, tmp_path):
    """`group` and `train --layout-file` split off the same validation points (fraction and seed), or `train`
    refuses the layout as one of another training split."""
    layout_file = tmp_path / "layout.safetensors"
    split = ["--validation-fraction", "0.25", "--seed", "7"]
    group = ["group", *common(dataset_dir), "--encoder", str(encoder_dir), "--output", str(layout_file)]
    assert main([*group, "--group-size", "4", "--grouping", "frequency", *split]) == 0
    train = ["train", *common(dataset_dir), "--encoder", str(encoder_dir), "--output-dir", str(tmp_path / "model")]
    assert main([*train, "--max-steps", "1", "--fan-in", "8", "--layout-file", str(layout_file), *split]) == 0
    model = HasteForExtremeClassification.from_pretrained(tmp_path / "model")
    assert torch.equal(model.output_layer.output_labels, LabelLayout.load(layout_file).output_labels())
