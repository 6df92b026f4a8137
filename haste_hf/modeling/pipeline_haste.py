# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The `text-classification` pipeline of HASTE models: label names and scores of the top-k labels.

`TextClassificationPipeline` scores every label of every text (`[B, L]` logits, then a dict per label and a sort
per text), which at 10^5 labels takes minutes where the encoder takes seconds. For a HASTE model this subclass asks
the model for its `top_k` labels (`predict_topk`, the chunked top-k over the tail) and turns them into
`{"label", "score"}` dicts; built for any other model it builds transformers' own `TextClassificationPipeline`.

It is the default `text-classification` pipeline of a HASTE model, however `pipeline()` is called:
- with the package, `import haste_hf` names this class as the task's class in transformers' pipeline registry
  (`auto_registration.register_pipeline`); built for any other model, it returns transformers' own class, so every
  other model's pipeline is the object it was;
- without it, a saved HASTE model's `config.json` names this class in `custom_pipelines`, so
  `pipeline(..., trust_remote_code=True)` finds it in the code saved with the model.

Flat and imports only transformers and numpy, so it is exported with the model's code.
"""

import numbers

import numpy as np
from transformers.pipelines.text_classification import ClassificationFunction, TextClassificationPipeline


HASTE_MODEL_TYPE = "haste_xmc"


def is_haste_model(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == HASTE_MODEL_TYPE


class HasteTextClassificationPipeline(TextClassificationPipeline):
    """`TextClassificationPipeline` that serves a HASTE model from its top-k labels, never a `[B, L]` tensor; built
    for any other model, it is transformers' own `TextClassificationPipeline`.

    Call arguments, as for any text-classification pipeline:
        top_k (`int`, *optional*): labels per text, best first (a list of dicts per text). Without it, the best
            label alone (one dict per text), as the parent pipeline does. `top_k=None` (every label) is refused.
        function_to_apply (`str`, *optional*): `"sigmoid"` (default: HASTE trains each label with a binary
            cross-entropy, so scores are independent probabilities) or `"none"` (raw logits). `"softmax"` is
            refused: a softmax over the k best labels alone is no probability.

    Labels are the model's `label_names`, or `LABEL_{id}` when it has none (transformers' default naming).
    Texts are truncated to the tokenizer's `model_max_length`, at most the encoder's positions, unless
    `truncation=False` is passed (then a longer text is refused). No texts (`[]`) give no results (`[]`).
    """

    def __new__(cls, *args, **kwargs):
        # `pipeline()` builds the registered class for every model of the task: any model but a HASTE one gets
        # transformers' own pipeline, the same object as without the package. (No model: a copy being rebuilt.)
        model = kwargs.get("model", args[0] if args else None)
        if model is not None and not is_haste_model(model):
            return TextClassificationPipeline(*args, **kwargs)
        return super().__new__(cls)

    def check_model_type(self, supported_models):
        # HASTE models are registered with AutoModelForSequenceClassification at run time; the parent checks
        # a static list of names.
        pass

    def _sanitize_parameters(self, function_to_apply=None, top_k="", **tokenizer_kwargs):
        # `top_k=""` is the parent's mark of "not given". The parent ignores a `top_k` that is no int (2.5, [],
        # numpy.int64) and returns the best label alone: checked here instead, before the parent sees it.
        if not (isinstance(top_k, str) and top_k == ""):
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
        # As `haste-hf predict` does: texts are cut at the tokenizer's `model_max_length` (the training length),
        # and never beyond what the encoder reads (a tokenizer may name no length, or a longer one).
        preprocess_params.setdefault("truncation", True)
        limit = self.model.max_input_tokens
        if preprocess_params["truncation"] and "max_length" not in preprocess_params and limit is not None:
            preprocess_params["max_length"] = min(self.tokenizer.model_max_length, limit)
        if "top_k" in postprocess_params:
            forward_params["top_k"] = postprocess_params["top_k"]
        if postprocess_params.get("function_to_apply") == ClassificationFunction.SOFTMAX:
            raise ValueError(
                "`function_to_apply='softmax'` is not supported for a HASTE model: its labels are scored "
                "independently (binary cross-entropy). Use 'sigmoid' (the default) or 'none'."
            )
        return preprocess_params, forward_params, postprocess_params

    def __call__(self, inputs, **kwargs):
        if isinstance(inputs, (list, tuple)) and len(inputs) == 0:
            self._sanitize_parameters(**kwargs)  # the arguments are checked all the same
            return []  # no texts, no results (as `haste-hf predict` writes no line)
        return super().__call__(inputs, **kwargs)

    def _forward(self, model_inputs, top_k=1):
        return self.model.predict_topk(**model_inputs, k=top_k)

    def postprocess(self, model_outputs, function_to_apply=None, top_k=1, _legacy=True):
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
