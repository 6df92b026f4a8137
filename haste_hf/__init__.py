# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE extreme multi-label classifiers for Hugging Face Transformers.

Importing the package is light (neither torch nor transformers loads) and changes nothing of transformers:
- `HasteConfig` / `HasteForExtremeClassification` are registered with `AutoConfig`, `AutoModel` and
  `AutoModelForSequenceClassification` under the model type ``haste_xmc`` as soon as transformers' auto
  classes load (see `auto_registration`), so `AutoModel.from_pretrained` loads saved models;
- the classes are registered for auto-class export, so every `save_pretrained` folder carries the model's
  code and loads with `trust_remote_code=True` where `haste_hf` is not installed;
- `pipeline("text-classification", model=...)` serves HASTE models with `HasteTextClassificationPipeline`
  (the top-k labels' names and sigmoid scores, without a `[B, L]` matrix), named as the task's class in
  transformers' pipeline registry when transformers' pipelines load; it builds transformers' own
  `TextClassificationPipeline` for every other model.

Every public name is imported on first use, as transformers does.

Logging: every module logs through `logging_utils.get_logger`, under transformers' library logger
("transformers.haste_hf.*"), so `transformers.logging.set_verbosity_error()` silences haste_hf's warnings too.
"""

import importlib

from . import auto_registration


__version__ = "0.1.0"

auto_registration.install()

# Public name -> submodule that defines it, imported on first access.
_LAZY_EXPORTS = {
    "DEFAULT_HEAD_LABEL_FRACTION": "modeling.defaults",
    "HASTE_FORMAT_VERSION": "modeling.configuration_haste",
    "HasteConfig": "modeling.configuration_haste",
    "ExtremeClassifierOutput": "modeling.modeling_haste",
    "HasteForExtremeClassification": "modeling.modeling_haste",
    "HastePreTrainedModel": "modeling.modeling_haste",
    "GroupSparseLinear": "modeling.sparse_ops",
    "HasteOutputLayer": "modeling.output_layer",
    "TopKOutput": "modeling.output_layer",
    "HasteTextClassificationPipeline": "modeling.pipeline_haste",
    "group_sparse_linear": "modeling.sparse_ops",
    "HasteTrainer": "training.trainer",
    "HasteTrainingArguments": "training.training_args",
    "RewiringCallback": "training.callbacks",
    "LabelLayout": "labels.layout",
    "LabelGrouping": "labels.grouping",
    "compute_label_embeddings": "labels.embeddings",
    "group_labels": "labels.grouping",
    "split_head_tail": "labels.layout",
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


__all__ = list(_LAZY_EXPORTS)
