# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE extreme multi-label classifiers for Hugging Face Transformers.

Importing the package
- registers `HasteConfig` / `HasteForExtremeClassification` with `AutoConfig`, `AutoModel` and
  `AutoModelForSequenceClassification` under the model type ``haste_xmc``;
- registers them for auto-class export, so every `save_pretrained` folder carries the model's code and loads
  with `trust_remote_code=True` where `haste_hf` is not installed;
- makes `HasteTextClassificationPipeline` the implementation of the `text-classification` pipeline task: HASTE
  models are served from their top-k labels, every other model exactly as before.

The training API (`train`, `HasteTrainer`, ...) is imported on first use, as transformers does, so
`import haste_hf` stays light.
"""

import importlib

from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_haste import DEFAULT_HEAD_LABEL_FRACTION, HASTE_FORMAT_VERSION, HasteConfig
from .modeling_haste import ExtremeClassifierOutput, HasteForExtremeClassification, HastePreTrainedModel
from .output_layer import GroupSparseLinear, HasteOutputLayer, TopKOutput
from .pipeline_haste import HasteTextClassificationPipeline
from .sparse_ops import group_sparse_linear


def _publish(model, repo_id, **kwargs):
    from .hub import push_to_hub

    return push_to_hub(model, repo_id, **kwargs)


__version__ = "0.1.0"

AutoConfig.register(HasteConfig.model_type, HasteConfig, exist_ok=True)
AutoModel.register(HasteConfig, HasteForExtremeClassification, exist_ok=True)
AutoModelForSequenceClassification.register(HasteConfig, HasteForExtremeClassification, exist_ok=True)
HasteConfig.register_for_auto_class()
HasteForExtremeClassification.register_for_auto_class("AutoModel")  # HasteConfig.to_dict names the other one
PIPELINE_REGISTRY.supported_tasks["text-classification"]["impl"] = HasteTextClassificationPipeline
HasteConfig.pipeline_is_installed = True
# `model.push_to_hub` publishes card and code through the package, which sits above the model.
HasteForExtremeClassification.hub_publisher = staticmethod(_publish)

# Public name -> submodule that defines it, imported on first access.
_LAZY_EXPORTS = {
    "HasteTrainer": "trainer",
    "HasteTrainingArguments": "training_args",
    "RewiringCallback": "callbacks",
    "LabelLayout": "label_plan",
    "LabelGrouping": "grouping",
    "compute_label_embeddings": "grouping",
    "group_labels": "grouping",
    "split_head_tail": "grouping",
    "XMCDataCollator": "data",
    "load_xmc_dataset": "data",
    "Propensity": "metrics",
    "compute_xmc_metrics": "metrics",
    "make_compute_metrics": "metrics",
    "RecipeArguments": "recipe",
    "TrainingRun": "recipe",
    "train": "recipe",
    "export_onnx": "export",
    "OnnxClassifier": "onnx_serving",
}


def __getattr__(name: str):
    if name not in _LAZY_EXPORTS:
        raise AttributeError(f"module 'haste_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_EXPORTS))


__all__ = [
    "DEFAULT_HEAD_LABEL_FRACTION",
    "HASTE_FORMAT_VERSION",
    "ExtremeClassifierOutput",
    "GroupSparseLinear",
    "HasteConfig",
    "HasteForExtremeClassification",
    "HasteOutputLayer",
    "HastePreTrainedModel",
    "HasteTextClassificationPipeline",
    "TopKOutput",
    "group_sparse_linear",
    *_LAZY_EXPORTS,
]
