# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Scoring a trained model: `predict_top_k` (the top-k labels of texts, over every process of a run),
`evaluate_split` (the XMC metrics of a split) and the evaluation-settings file `train` writes beside the model,
from which `haste-hf evaluate` and `predict` read how the texts were read and scored."""

import json
from pathlib import Path

import numpy as np

from .data import DATA_FORMATS
from .metrics import DEFAULT_KS
from .modeling.defaults import (
    DEFAULT_EVAL_BATCH_SIZE,
    DEFAULT_MAX_LENGTH,
)
from .modeling.logging_utils import get_logger
from .modeling.model_sources import HUB_ID_PATTERN


logger = get_logger(__name__)

# How `train` read and scored texts, kept beside the model so that `haste-hf evaluate` and `predict` reproduce
# the test metrics that `train` printed without the flags being repeated. The token limit is not in it: it is
# the saved tokenizer's `model_max_length`, which `pipeline` and every tokenizer call honour too.
EVALUATION_SETTINGS_FILE = "evaluation_settings.json"
EVALUATION_SETTINGS = ("format", "text_fields", "dataset_name", "propensity_a", "propensity_b")
SAVED_EVALUATION_SETTINGS = (*EVALUATION_SETTINGS, "eval_batch_size")


def process_rank_and_count() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside torchrun / accelerate launch."""
    import torch.distributed as dist

    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def predict_top_k(
    model,
    tokenizer,
    texts,
    k: int,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
    desc: str = "Predicting",
):
    """Top-k label ids and scores `[N, k]` for `texts` (rows in their order), in batches, with a progress bar.

    The texts are batched by length (of characters: no tokenising ahead), so that a batch pads its texts to little
    more than their own length: the encoder's time follows the tokens it reads, not `batch_size` x the longest text.
    Under several processes each rank predicts a contiguous share of the texts in the same number of batches
    (a sharded output layer scores them together), and every rank returns all rows.
    """
    import math

    import torch
    from tqdm.auto import tqdm

    from .labels.embeddings import prepared_ahead
    from .training.distributed import balanced_ranges

    rank, world_size = process_rank_and_count()
    device = next(model.parameters()).device
    model.eval()
    texts = list(texts)
    shares = balanced_ranges(len(texts), world_size)
    batch_count = max(1, math.ceil(max(stop - start for start, stop in shares) / batch_size))
    start, stop = shares[rank]

    pin = device.type == "cuda"

    def tokenize(batch_texts):  # a rank out of texts still joins the collective, with an empty batch
        batch = tokenizer(
            list(batch_texts) or [""], truncation=True, max_length=max_length, padding=True, return_tensors="pt"
        )
        # Pinned, the copy to the GPU is asynchronous: the host goes on to launch the batch's work.
        return {
            name: tensor[: len(batch_texts)].pin_memory() if pin else tensor[: len(batch_texts)]
            for name, tensor in batch.items()
        }

    # Batches are tokenised ahead in threads, and the top-k stay on the device until the end: the GPU does not
    # wait for the tokenizer, nor the tokenizer for the GPU.
    share = np.asarray(texts[start:stop], dtype=object)
    by_length = np.argsort(np.fromiter(map(len, share), dtype=np.int64, count=len(share)), kind="stable")
    ids, scores = [], []
    batches = np.array_split(share[by_length], batch_count)
    for _, batch in tqdm(
        prepared_ahead(tokenize, batches), total=len(batches), desc=desc, unit="batch", disable=rank != 0
    ):
        with torch.no_grad():
            top = model.predict_topk(
                **{name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}, k=k
            )
        ids.append(top.label_ids)
        scores.append(top.scores)
    in_order = np.empty_like(by_length)
    in_order[by_length] = np.arange(len(by_length))  # the sorted row of each text
    ids, scores = torch.cat(ids).cpu().numpy()[in_order], torch.cat(scores).cpu().numpy()[in_order]
    if world_size > 1:
        import torch.distributed as dist

        parts = [None] * world_size
        dist.all_gather_object(parts, (ids, scores))
        ids, scores = np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])
    bad = np.flatnonzero(~np.isfinite(scores).all(axis=1))
    if bad.size:
        raise FloatingPointError(
            f"The model scores {bad.size} of {len(texts)} texts (the first: number {bad[0] + 1}) with NaN or infinity: "
            "its weights or its encoder's outputs are not finite."
        )
    return ids, scores


def evaluate_split(
    model,
    tokenizer,
    data,
    split: str,
    propensity,
    *,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
    ks=DEFAULT_KS,
) -> dict[str, float]:
    """Metrics of `model` on `data.splits[split]`, filtered by the split's filter file if there is one; metrics
    at k beyond the model's label count are left out (a 3-label model has no P@5)."""
    from .metrics import compute_xmc_metrics, filter_top_k, max_filtered_per_point

    dataset = data.splits[split]
    filters = (data.filters or {}).get(split)
    label_count = model.config.label_count
    ks = tuple(k for k in ks if k <= label_count)
    k = min(label_count, max(ks) + (max_filtered_per_point(filters) if filters is not None else 0))
    top_ids, _ = predict_top_k(model, tokenizer, dataset["text"], k, batch_size, max_length, f"Evaluating {split}")
    if filters is not None:
        top_ids = filter_top_k(top_ids, filters, k=max(ks))
    return compute_xmc_metrics(top_ids, dataset["labels"], ks=ks, propensity=propensity)


def _is_positive_number(value) -> bool:
    """As `--propensity-a` / `--propensity-b` take them: NaN, 0 and negatives are no propensity parameters."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


# What each key of `evaluation_settings.json` may hold. A model folder may come from anyone (the Hub, a colleague):
# only these keys are read, each checked, so a folder never chooses the data read or a file written (`--data`,
# `--output`, ...).
_EVALUATION_SETTING_CHECKS = {
    "format": (lambda value: value in DATA_FORMATS, f"one of {DATA_FORMATS}"),
    "text_fields": (lambda value: value in ("title", "title_content"), "'title' or 'title_content'"),
    "dataset_name": (
        lambda value: isinstance(value, str) and HUB_ID_PATTERN.match(value) is not None and ".." not in value,
        "a dataset name such as 'LF-AmazonTitles-131K'",
    ),
    "propensity_a": (_is_positive_number, "a number > 0"),
    "propensity_b": (_is_positive_number, "a number > 0"),
    "eval_batch_size": (
        lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0,
        "a positive integer",
    ),
}


def saved_evaluation_settings(model_dir) -> dict:
    """The `SAVED_EVALUATION_SETTINGS` and `max_length` a trained folder's test metrics were computed with; {} for
    other folders. Other keys of the file are ignored with a warning; a known key of the wrong type or value is an error
    naming the file and the key."""
    from transformers import AutoTokenizer

    path = Path(model_dir) / EVALUATION_SETTINGS_FILE
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a JSON file ({error}); delete it to evaluate without it") from None
    if not isinstance(saved, dict):
        raise ValueError(
            f"{path} holds {type(saved).__name__}, not an object of settings; delete it to evaluate without it"
        )
    ignored = sorted(set(saved) - set(SAVED_EVALUATION_SETTINGS))
    if ignored:
        logger.warning(f"{path}: ignoring {ignored}; a model folder may only set {list(SAVED_EVALUATION_SETTINGS)}")
    settings = {}
    for name in SAVED_EVALUATION_SETTINGS:
        if name not in saved or saved[name] is None:
            continue
        is_valid, expected = _EVALUATION_SETTING_CHECKS[name]
        if not is_valid(saved[name]):
            raise ValueError(f"{path}: {name!r} is {saved[name]!r}, expected {expected}; fix or delete the file")
        settings[name] = saved[name]
    settings["max_length"] = AutoTokenizer.from_pretrained(model_dir).model_max_length
    return settings
