# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Scoring a trained model: `predict_top_k` (the top-k labels of texts, over every process of a run),
`evaluate_split` (the XMC metrics of a split) and the evaluation-settings file `train` writes beside the model,
from which `haste-hf evaluate` and `predict` read how the texts were read and scored."""

import itertools
import json
import math
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

    With a fast tokenizer the texts go as the label embeddings' do (`embeddings.token_chunks_ahead`): chunks
    tokenised ahead of the GPU (in worker processes from `tokenizer_processes.MIN_TEXTS` texts), sorted by token
    length and cut into batches of `embedding_token_budget(batch_size, max_length)` padded tokens (at least 65,536 on
    a GPU: short texts go hundreds to a batch, and the host's launches per batch no longer set the pace), the padding
    gathered on the device. Otherwise each chunk is sorted by characters and cut into batches of `batch_size` texts.
    On a GPU with bf16 the encoder runs under bf16 autocast, as training does. The top-k stay on the device, each
    row written where its text was, and come to the host once. Under several processes each rank predicts a
    contiguous share of the texts in as many batches as the others (a sharded output layer scores them together;
    a rank out of batches joins with empty ones), and every rank returns all rows.
    """
    import torch
    from tqdm.auto import tqdm

    from .labels.token_batches import fast_backend
    from .training.distributed import balanced_ranges

    rank, world_size = process_rank_and_count()
    device = next(model.parameters()).device
    model.eval()
    texts = texts if isinstance(texts, list) else list(texts)
    start, stop = balanced_ranges(len(texts), world_size)[rank]
    share = texts[start:stop]
    backend = fast_backend(tokenizer, max_length)
    chunks = (
        _token_chunks(tokenizer, backend, share, batch_size, max_length, device)
        if backend is not None
        else _text_chunks(tokenizer, share, batch_size, max_length, device)
    )
    ids = torch.empty(len(share), k, dtype=torch.int64, device=device)
    scores = torch.empty(len(share), k, dtype=torch.float32, device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda" and _has_bf16(device))
    progress = tqdm(total=len(share), desc=desc, unit="text", disable=rank != 0)
    offset = 0
    with torch.no_grad(), autocast:
        for chunk_size, batches in _agreed_batches(chunks, world_size, device):
            for rows, inputs in batches:
                top = model.predict_topk(**inputs, k=k)
                ids[offset + rows] = top.label_ids
                scores[offset + rows] = top.scores
                progress.update(len(rows))
            offset += chunk_size
    progress.close()
    ids, scores = ids.cpu().numpy(), scores.cpu().numpy()
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


def _has_bf16(device) -> bool:
    import torch

    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported()


def _token_chunks(tokenizer, backend, texts, batch_size, max_length, device):
    """`(chunk size, [(rows, inputs)...])` of `texts` in `TokenChunk`s: `rows` the chunk's rows of the batch's texts
    (on the device), `inputs` the encoder's, gathered when asked for."""
    from .labels.embeddings import embedding_token_budget, padded_inputs, token_chunks_ahead

    budget = embedding_token_budget(batch_size, max_length, device)
    for chunk in token_chunks_ahead(tokenizer, backend, texts, budget, device, total=len(texts)):
        bounds = list(zip(chunk.bounds, chunk.bounds[1:]))
        yield (
            chunk.size,
            ((chunk.order[start:end], padded_inputs(chunk, start, end, tokenizer)) for start, end in bounds),
            len(bounds),
        )


def _text_chunks(tokenizer, texts, batch_size, max_length, device):
    """As `_token_chunks`, for a tokenizer without a Rust backend (or a callable): each chunk of texts sorted by
    characters, in batches of `batch_size` texts tokenised ahead in threads."""
    import torch

    from .labels.embeddings import CHUNK_TEXTS, prepared_ahead

    pin = device.type == "cuda"

    def tokenize(batch_texts):
        batch = tokenizer(list(batch_texts), truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        # Pinned, the copy to the GPU is asynchronous: the host goes on to launch the batch's work.
        return {name: tensor.pin_memory() if pin else tensor for name, tensor in batch.items()}

    for chunk_start in range(0, len(texts), CHUNK_TEXTS):
        chunk = np.asarray(texts[chunk_start : chunk_start + CHUNK_TEXTS], dtype=object)
        by_length = np.argsort(np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk)), kind="stable")
        batches = [rows for rows in np.array_split(by_length, math.ceil(len(chunk) / batch_size)) if rows.size]
        prepared = prepared_ahead(tokenize, batches, texts_of=lambda rows, chunk=chunk: chunk[rows])
        yield (
            len(chunk),
            (
                (
                    torch.from_numpy(rows).to(device),
                    {name: t.to(device, non_blocking=True) for name, t in inputs.items()},
                )
                for rows, inputs in prepared
            ),
            len(batches),
        )


def _agreed_batches(chunks, world_size: int, device):
    """`(chunk size, batches)` of each of this rank's `chunks` (`(size, batches, count)`), each rank's chunk made as
    many batches as the other ranks' (empty ones added), and empty chunks while other ranks have chunks left: one
    small all-reduce a chunk."""
    import torch

    if world_size == 1:
        yield from ((size, batches) for size, batches, _ in chunks)
        return
    import torch.distributed as dist

    empty = {name: torch.zeros(0, 1, dtype=torch.int64, device=device) for name in ("input_ids", "attention_mask")}
    no_rows = torch.zeros(0, dtype=torch.int64, device=device)
    chunks = iter(chunks)
    while True:
        size, batches, count = next(chunks, (0, iter(()), -1))
        agreed = torch.tensor([count], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        most = int(agreed)
        if most < 0:  # no rank has a chunk left
            return
        yield size, itertools.chain(batches, itertools.repeat((no_rows, empty), most - max(count, 0)))


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


# The training counts of every label (int32) and the number of training points, written beside the model by
# `train`: `haste-hf evaluate` takes the propensities from them instead of reading the training file again (60-70 s
# at 10^8 labels), where the dataset's training files are the ones counted (names, sizes, modification times).
TRAINING_COUNTS_FILE = "training_label_counts.safetensors"
_TRAINING_COUNTS_VERSION = "1"


def training_files_stamp(data) -> str:
    """The training files of the dataset folder `data` (None: the embedded demo set): a SHA-256 of its path and of
    each file of the training split's name, size and modification time (a hash: a folder pushed to the Hub does not
    publish local paths)."""
    import hashlib

    from .data import demo_dataset_path

    folder = Path(data if data is not None else demo_dataset_path()).resolve()
    training = sorted(
        path
        for path in folder.iterdir()
        if path.is_file()
        and (path.name.startswith("trn") or path.name == "train.txt" or path.name.endswith("_train.txt"))
    )
    files = [[path.name, path.stat().st_size, path.stat().st_mtime_ns] for path in training]
    return hashlib.sha256(json.dumps({"folder": str(folder), "files": files}).encode()).hexdigest()


def write_training_counts(folder, label_frequencies, train_points: int, data) -> None:
    """Writes `TRAINING_COUNTS_FILE` into `folder`: the training counts `[L]` (int32), `train_points` and the stamp
    of `data`'s training files (`training_files_stamp`)."""
    from safetensors.numpy import save_file

    counts = np.asarray(label_frequencies)
    if counts.max(initial=0) > np.iinfo(np.int32).max:
        return  # past 2^31 - 1 points: evaluate reads the training file
    metadata = {"version": _TRAINING_COUNTS_VERSION, "train_points": str(int(train_points))}
    metadata["training_files"] = training_files_stamp(data)
    save_file({"label_counts": counts.astype(np.int32, copy=False)}, str(Path(folder) / TRAINING_COUNTS_FILE), metadata)


def saved_training_counts(model_dir, label_count: int, data) -> tuple[np.ndarray, int] | None:
    """`(counts, train_points)` of `TRAINING_COUNTS_FILE` in `model_dir`, where it counted the training files of the
    dataset folder `data` as they are now, of `label_count` labels; None where the folder has no such file, or it
    counted other files or another label count (`add-labels` into the folder): then read the training file. A file
    that is not what `train` writes is an error naming it."""
    from safetensors import safe_open

    path = Path(model_dir) / TRAINING_COUNTS_FILE
    if not path.is_file():
        return None
    fix = "fix or delete the file (evaluate then reads the training file)"
    try:
        with safe_open(str(path), framework="numpy") as handle:
            metadata = handle.metadata() or {}
            names = handle.keys()
            counts = handle.get_tensor("label_counts") if "label_counts" in names else None
    except Exception as error:  # safetensors raises its own errors for a file that is not one
        raise ValueError(f"{path} is not a safetensors file ({error}); {fix}") from None
    points = metadata.get("train_points", "")
    if metadata.get("version") != _TRAINING_COUNTS_VERSION or not points.isdigit() or counts is None:
        raise ValueError(
            f"{path} is not a file of training counts `train` writes (version, train_points, label_counts); {fix}"
        )
    points = int(points)
    if counts.dtype != np.int32 or counts.ndim != 1:
        raise ValueError(
            f"{path} holds counts of dtype {counts.dtype} and shape {list(counts.shape)}, expected int32 "
            f"[label count]; {fix}"
        )
    if counts.size != label_count:  # the folder's labels before `add-labels` wrote into it: counts of another model
        logger.warning(
            f"{path} counts {counts.size:,} labels, the model has {label_count:,}: the training file is read."
        )
        return None
    if counts.size and (counts.min() < 0 or counts.max() > points):
        raise ValueError(f"{path} holds counts outside [0, {points}] (its train_points); {fix}")
    if metadata.get("training_files") != training_files_stamp(data):
        logger.info(f"{path} counted other training files than those of {data}: the training file is read.")
        return None
    return counts, points


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
