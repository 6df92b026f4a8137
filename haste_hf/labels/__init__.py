# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The label plan: which labels the dense head models and how the tail's labels are grouped (`layout`,
`grouping`)."""
