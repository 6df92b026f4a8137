# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The `evaluate` loading script of HASTE's ranking metrics (P@k, nDCG@k, R@k, and PSP@k / PSnDCG@k with a
propensity): `evaluate.load(haste_hf.metrics.EVALUATE_METRIC_PATH, ks=(1, 3, 5))` finds it, as it finds the Hub's
metrics, without a download. `evaluate` takes the first metric class this module holds: `XMCMetric`."""

from haste_hf.metrics import XMCMetric


__all__ = ["XMCMetric"]
