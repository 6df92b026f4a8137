"""The arithmetic of benchmarks/serving.py: P@k of each variant's top-k, and speed-ups over PyTorch eager."""

import numpy as np
from benchmark_scripts import load_benchmark


serving = load_benchmark("serving")


def test_precision_scores_each_variant_on_the_same_batches():
    batches = [
        (np.zeros((2, 3), np.int64), np.ones((2, 3), np.int64)),
        (np.zeros((1, 3), np.int64), np.ones((1, 3), np.int64)),
    ]
    labels = [[0], [1], [9]]
    perfect = iter([np.array([[0, 5, 6, 7, 8], [1, 5, 6, 7, 8]]), np.array([[9, 5, 6, 7, 8]])])
    third_only = iter([np.array([[5, 6, 0, 7, 8], [5, 6, 7, 8, 2]]), np.array([[5, 6, 7, 8, 2]])])
    calls = {"pytorch": lambda *batch: next(perfect), "onnx": lambda *batch: next(third_only)}
    results = serving.precision(calls, batches, labels)
    assert np.allclose(results["pytorch"], [1.0, 1 / 3, 1 / 5])
    assert np.allclose(results["onnx"], [0.0, 1 / 9, 1 / 15])


def test_table_gives_speed_ups_over_eager():
    timings = {
        1: {"pytorch": (20.0, 50.0, 60.0), "onnx": (50.0, 20.0, 25.0)},
        32: {"pytorch": (100.0, 320.0, 400.0), "onnx": (150.0, 213.0, 300.0)},
    }
    text = serving.table(
        {"pytorch": [0.5, 0.4, 0.3], "onnx": [0.5, 0.4, 0.3]}, timings, {"pytorch": 9e7, "onnx": 9.1e7}
    )
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert rows["pytorch"].endswith("| 1.00x |") and "| 1.00x |" in rows["pytorch"]
    assert "| 50.0 | 20.00 | 25.00 | 2.50x |" in rows["onnx"] and rows["onnx"].endswith("| 1.50x |")
    assert "| 50.00 | 40.00 | 30.00 | 91.0 |" in rows["onnx"]
