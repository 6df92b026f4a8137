# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Label embeddings for semantic grouping: a label's embedding is the normalised mean of the (normalised) encoder
embeddings of its positive training instances."""

import math
from collections.abc import Callable, Iterable, Sequence
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..modeling.configuration_haste import default_pooling
from ..modeling.defaults import (
    DEFAULT_EVAL_BATCH_SIZE,
    DEFAULT_MAX_LENGTH,
    LABEL_PADDING_ID,
    POOLING_MODES,
    check_one_of,
)
from ..modeling.logging_utils import get_logger
from ..modeling.modeling_haste import pool_hidden_states
from .grouping import _default_device


logger = get_logger(__name__)


def _text_embedder(encoder, tokenizer, pooling: str | None, max_length: int | None, device: torch.device):
    """Returns `(embed, restore)`: `embed(list[str]) -> [B, d]` and a callable undoing changes to the encoder."""
    from transformers import PreTrainedModel

    if isinstance(encoder, str):
        from transformers import AutoModel, AutoTokenizer

        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(encoder)
        encoder = AutoModel.from_pretrained(encoder)

    if isinstance(encoder, PreTrainedModel):
        if tokenizer is None:
            raise ValueError("`tokenizer` is required when `encoder` is a transformers model.")
        pooling = pooling or default_pooling(encoder.config)
        was_training = encoder.training
        encoder.to(device).eval()

        def embed(texts: list[str]) -> torch.Tensor:
            inputs = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            inputs = inputs.to(device)
            outputs = encoder(**inputs)
            hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
            return pool_hidden_states(hidden, inputs["attention_mask"], pooling)

        return embed, lambda: encoder.train(was_training)

    if pooling is not None:
        logger.warning(
            f"`pooling={pooling!r}` is ignored: it applies to a transformers encoder, this one embeds texts itself."
        )
    if callable(getattr(encoder, "encode", None)):  # a sentence-transformers model (duck-typed)

        def embed(texts: list[str]) -> torch.Tensor:
            return torch.as_tensor(
                encoder.encode(texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False)
            )

        return embed, lambda: None

    if callable(encoder):
        return (lambda texts: torch.as_tensor(encoder(texts))), lambda: None

    raise TypeError(
        "`encoder` must be a transformers model (with `tokenizer`), a model name, an object with an `encode` "
        f"method (sentence-transformers) or a callable mapping a list of texts to embeddings; got {type(encoder)}."
    )


def _batched(iterable: Iterable, size: int):
    iterator = iter(iterable)
    while batch := list(islice(iterator, size)):
        yield batch


@torch.no_grad()
def compute_label_embeddings(
    encoder: "str | Callable | torch.nn.Module",
    texts: Iterable[str],
    labels: Iterable[Sequence[int]],
    label_count: int,
    *,
    tokenizer=None,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    pooling: str | None = None,
    device: str | torch.device | None = None,
    show_progress: bool = True,
) -> torch.Tensor:
    """Label embeddings from the positive training instances of each label.

    `e_l = normalize(mean_{i: y_il = 1} normalize(h_i))`, where `h_i` is the encoder embedding of training text
    `i`. Instances are streamed in batches; only the `[label_count, d]` float32 accumulator is kept in memory.

    Args:
        encoder: one of
            - a transformers model (e.g. `AutoModel.from_pretrained(...)`) with `tokenizer`; its last hidden
              state is pooled with `pooling`. The model is moved to `device` and run in eval mode (its training
              mode is restored afterwards);
            - a model name or path, loaded with `AutoModel` / `AutoTokenizer`;
            - an object with a sentence-transformers style `encode(texts, ...)` method (used as is);
            - any callable mapping a list of texts to a `[len(texts), d]` tensor or array.
        texts: training texts, e.g. `dataset["text"]`; any iterable, read once.
        labels: for each text, the ids of its positive labels, e.g. `dataset["labels"]`; same length as `texts`.
        label_count: total number of labels `L`; every id must be in `[0, L)`.
        tokenizer: tokenizer of a transformers `encoder`.
        batch_size: number of texts encoded at once.
        max_length: truncation length for a transformers `encoder`.
        pooling: `"cls"` (first token), `"mean"` (masked mean) or `"last_token"` (last attended token), for a
            transformers `encoder`; by default the pooling a HASTE model over this encoder uses
            (`configuration_haste.default_pooling`), so the labels are embedded as the model embeds texts.
        device: where the encoder and the accumulator live; defaults to CUDA when available.
        show_progress: show a tqdm progress bar over batches.

    Returns:
        `[label_count, d]` float32 tensor on `device`, rows of unit norm. A label without any positive instance
        gets the zero vector; `group_labels` places such labels after all semantically grouped ones.
    """
    if pooling is not None:
        check_one_of("pooling", pooling, POOLING_MODES)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")
    if isinstance(label_count, bool) or not isinstance(label_count, (int, np.integer)) or label_count < 1:
        raise ValueError(f"`label_count` must be a positive integer, got {label_count!r}.")
    device = _default_device(device)
    embed, restore = _text_embedder(encoder, tokenizer, pooling, max_length, device)

    try:
        num_batches = math.ceil(len(texts) / batch_size)
    except TypeError:
        num_batches = None
    sums = None
    try:
        batches = _batched(zip(texts, labels, strict=True), batch_size)
        for batch_index, batch in enumerate(
            tqdm(batches, total=num_batches, desc="Label embeddings", unit="batch", disable=not show_progress)
        ):
            batch_texts = [text for text, _ in batch]
            label_lists = [np.asarray(ids, dtype=np.int64).reshape(-1) for _, ids in batch]
            flat_labels = np.concatenate(label_lists)
            if flat_labels.size and (flat_labels.min() < 0 or flat_labels.max() >= label_count):
                raise ValueError(
                    f"Label ids in batch {batch_index} must be in [0, {label_count}) (`label_count`); got ids in "
                    f"[{flat_labels.min()}, {flat_labels.max()}]. Remove padding values such as {LABEL_PADDING_ID}."
                )
            instance_embeddings = embed(batch_texts)
            if instance_embeddings.ndim != 2 or instance_embeddings.shape[0] != len(batch_texts):
                raise ValueError(
                    f"The encoder must return one embedding per text: expected shape [{len(batch_texts)}, d], "
                    f"got {tuple(instance_embeddings.shape)}."
                )
            instance_embeddings = F.normalize(instance_embeddings.to(device=device, dtype=torch.float32), dim=1)
            if sums is None:
                sums = torch.zeros(label_count, instance_embeddings.shape[1], dtype=torch.float32, device=device)
            rows = torch.repeat_interleave(
                torch.arange(len(batch_texts), device=device),
                torch.as_tensor([len(ids) for ids in label_lists], device=device),
            )
            sums.index_add_(0, torch.from_numpy(flat_labels).to(device), instance_embeddings[rows])
    finally:
        restore()
    if sums is None:
        raise ValueError("`texts` is empty: label embeddings need at least one training instance.")
    # normalize(sum / count) == normalize(sum); F.normalize keeps all-zero rows (labels without positives) zero.
    return F.normalize(sums, dim=1)
