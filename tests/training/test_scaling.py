# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Several GPUs slower than one (issue 42): the advice's thresholds sit between the two measured runs."""

from haste_hf.training.scaling import SLOW_TEXT_LABELS, multi_gpu_advice


def test_one_process_gets_no_advice():
    assert multi_gpu_advice(43_054, 1, 1, sharded=False) is None


def test_the_measured_slow_run_is_told_with_its_reason():
    """`deps` (43,054 labels) at 32 texts a GPU on 4 GPUs trained slower than on one."""
    advice = multi_gpu_advice(43_054, 32, 4, sharded=False)
    assert advice is not None and "\n" not in advice
    assert "4 processes will likely train slower than one" in advice
    assert "32 texts x 43,054 labels = 1.4M text-labels a step" in advice
    assert "--per-device-train-batch-size" in advice


def test_the_measured_fast_run_is_not():
    """8.6M labels, sharded, 128 texts a GPU on 4 GPUs: 4.24x one GPU."""
    assert multi_gpu_advice(8_623_847, 128, 4, sharded=True) is None


def test_the_threshold_counts_the_labels_a_gpu_holds():
    labels = 2 * SLOW_TEXT_LABELS // 64
    assert multi_gpu_advice(labels, 64, 4, sharded=False) is None  # each GPU scores every label
    assert multi_gpu_advice(labels, 64, 4, sharded=True) is not None  # each scores a quarter of them
    assert multi_gpu_advice(SLOW_TEXT_LABELS // 64, 64, 2, sharded=False) is None
    assert multi_gpu_advice(SLOW_TEXT_LABELS // 64 - 1, 64, 2, sharded=False) is not None
