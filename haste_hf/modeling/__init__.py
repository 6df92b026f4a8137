# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The model's own code: everything `save_pretrained` copies beside a checkpoint (configuration, model, output
layer, ops, losses, rewiring, saving, defaults), so that the folder loads with `trust_remote_code=True` where
`haste_hf` is not installed.

The modules here import one another with single-dot imports and nothing else of `haste_hf`, except through
three named doors that fall back (or refuse in one line) when the package is absent: `sparse_ops` looks up
`haste_hf.kernels.ops` (the compiled kernels), `HasteForExtremeClassification.push_to_hub` calls `haste_hf.hub` and
`add_labels` calls `haste_hf.labels.additions` (`tests/modeling/test_import_rule.py` holds the rule).
"""
