# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE extreme multi-label classifiers for Hugging Face Transformers.

Importing the package registers `HasteConfig` / `HasteForExtremeClassification` with `AutoConfig` and
`AutoModel` under the model type ``haste_xmc``.
"""

from transformers import AutoConfig, AutoModel

from .configuration_haste import HASTE_FORMAT_VERSION, HasteConfig
from .modeling_haste import (
    ExtremeClassifierOutput,
    GroupSparseLinear,
    HasteForExtremeClassification,
    HastePreTrainedModel,
    TopKOutput,
)
from .sparse_ops import group_sparse_linear


__version__ = "0.1.0"

AutoConfig.register(HasteConfig.model_type, HasteConfig, exist_ok=True)
AutoModel.register(HasteConfig, HasteForExtremeClassification, exist_ok=True)

__all__ = [
    "HASTE_FORMAT_VERSION",
    "ExtremeClassifierOutput",
    "GroupSparseLinear",
    "HasteConfig",
    "HasteForExtremeClassification",
    "HastePreTrainedModel",
    "TopKOutput",
    "group_sparse_linear",
]
