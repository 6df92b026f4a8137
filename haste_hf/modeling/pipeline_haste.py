# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The `text-classification` pipeline of HASTE models: label names and scores of the top-k labels.

`TextClassificationPipeline` scores every label of every text (`[B, L]` logits, then a sort per text), which
at 10^5-10^7 labels costs more than the encoder. For a HASTE model this subclass asks the model for its `top_k`
labels (`predict_topk`, the chunked top-k over the tail) and turns them into `{"label", "score"}` dicts;
any other model gets the parent's behaviour unchanged.

Nothing installs it globally. `pipeline("text-classification", model=..., pipeline_class=HasteTextClassificationPipeline)`
uses it with the package; a saved HASTE model's `config.json` names it in `custom_pipelines`, so
`pipeline(..., trust_remote_code=True)` finds it in the exported code where `haste_hf` is not installed. With the
package, transformers' own `TextClassificationPipeline` serves the model of any label count from its logits (names
from `id2label`, see `HasteConfig.custom_pipelines`), with the same result.

Flat and imports only transformers and numpy, so it is exported with the model's code.
"""

import numbers

import numpy as np
from transformers.pipelines.text_classification import ClassificationFunction, TextClassificationPipeline


HASTE_MODEL_TYPE = "haste_xmc"


def is_haste_model(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == HASTE_MODEL_TYPE


class HasteTextClassificationPipeline(TextClassificationPipeline):
    """`TextClassificationPipeline` that serves a HASTE model from its top-k labels, never a `[B, L]` tensor.

    Call arguments, as for any text-classification pipeline:
        top_k (`int`, *optional*): labels per text, best first (a list of dicts per text). Without it, the best
            label alone (one dict per text), as the parent pipeline does. `top_k=None` (every label) is refused.
        function_to_apply (`str`, *optional*): `"sigmoid"` (default: HASTE trains each label with a binary
            cross-entropy, so scores are independent probabilities) or `"none"` (raw logits). `"softmax"` is
            refused: a softmax over the k best labels alone is no probability.

    Labels are the model's `label_names`, or `LABEL_{id}` when it has none (transformers' default naming).
    Texts are truncated to the tokenizer's `model_max_length` unless `truncation=False` is passed.
    """

    def check_model_type(self, supported_models):
        # HASTE models are registered with AutoModelForSequenceClassification at run time; the parent checks
        # a static list of names.
        if not is_haste_model(self.model):
            super().check_model_type(supported_models)

    def _sanitize_parameters(self, function_to_apply=None, top_k="", **tokenizer_kwargs):
        # `top_k=""` is the parent's mark of "not given". The parent ignores a `top_k` that is no int (2.5, [],
        # numpy.int64) and returns the best label alone: checked here instead, before the parent sees it.
        if is_haste_model(self.model) and not (isinstance(top_k, str) and top_k == ""):
            label_count = self.model.config.label_count
            if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or not 1 <= top_k <= label_count:
                raise ValueError(
                    f"`top_k` must be an integer in [1, {label_count}] for a HASTE model, got {top_k!r}: the pipeline "
                    "returns the k best labels of each text (top_k=None, every label, is not supported)."
                )
            top_k = int(top_k)
        preprocess_params, forward_params, postprocess_params = super()._sanitize_parameters(
            function_to_apply=function_to_apply, top_k=top_k, **tokenizer_kwargs
        )
        if is_haste_model(self.model):
            # As `haste-hf predict` does: texts are cut at the tokenizer's `model_max_length` (the training length).
            preprocess_params.setdefault("truncation", True)
            if "top_k" in postprocess_params:
                forward_params["top_k"] = postprocess_params["top_k"]
            if postprocess_params.get("function_to_apply") == ClassificationFunction.SOFTMAX:
                raise ValueError(
                    "`function_to_apply='softmax'` is not supported for a HASTE model: its labels are scored "
                    "independently (binary cross-entropy). Use 'sigmoid' (the default) or 'none'."
                )
        return preprocess_params, forward_params, postprocess_params

    def _forward(self, model_inputs, top_k=1):
        if not is_haste_model(self.model):
            return super()._forward(model_inputs)
        return self.model.predict_topk(**model_inputs, k=top_k)

    def postprocess(self, model_outputs, function_to_apply=None, top_k=1, _legacy=True):
        if not is_haste_model(self.model):
            return super().postprocess(model_outputs, function_to_apply=function_to_apply, top_k=top_k, _legacy=_legacy)
        label_ids = model_outputs["label_ids"][0].tolist()
        scores = model_outputs["scores"][0].float().numpy()
        if function_to_apply in (None, ClassificationFunction.SIGMOID):
            scores = 1.0 / (1.0 + np.exp(-scores))
        names = self.model.label_names
        results = [
            {"label": names[label_id] if names is not None else f"LABEL_{label_id}", "score": score.item()}
            for label_id, score in zip(label_ids, scores)
        ]
        return results[0] if _legacy else results


__all__ = ["HasteTextClassificationPipeline", "is_haste_model"]
