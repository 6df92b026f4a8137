# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""The output layer's rows started from the encoder's embeddings of its labels' own texts: every label on one process
(`init_from_label_texts_`), or each rank's share of a sharded layer (`init_share_from_label_texts_`)."""

from collections.abc import Sequence

import torch

from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE
from .embeddings import _with_text, label_text_embeddings
from .grouping import ArrayLike, _as_int64_vector


# Label texts whose mean embedding centres the label-text initialisation: enough for the mean, a moment at any L.
CENTER_SAMPLE = 4096


def _mean(blocks, count: int, features: int) -> torch.Tensor:
    """The mean of the rows of `blocks` (`count` in all); zeros `[features]` where there are none."""
    total = torch.zeros(features)
    for block in blocks:
        total = total.to(block.device) + block.sum(0)
    return total / max(1, count)


@torch.no_grad()
def _center(model, label_texts: Sequence[str], kept: torch.Tensor, options: dict) -> torch.Tensor:
    """The mean embedding of `CENTER_SAMPLE` of the texts `kept` (indices into `label_texts`) drawn at random (seeded;
    all of them when fewer; zeros when there are none)."""
    order = torch.randperm(kept.numel(), generator=torch.Generator().manual_seed(0))
    sample = kept[order[:CENTER_SAMPLE].sort().values].tolist()
    texts = [label_texts[i] for i in sample]
    blocks = label_text_embeddings(model.encoder, texts, **options)
    return _mean(blocks, len(sample), model.output_layer.in_features)


def init_share_from_label_texts_(model, label_texts: Sequence[str], *, tokenizer, group=None, **options) -> int:
    """`init_from_label_texts_` of one rank's share of a sharded output layer (collective): the center, as one
    process computes it from every label's text, computed by rank 0 alone and broadcast; then each rank embeds the
    texts of its own labels only (a quarter of them each on 4 GPUs, where each rank embedded every label's text and
    built the whole layer). `label_texts`: by label id (read only at the share's ids and, on rank 0, the center's
    sample). The rows equal the one-process run's up to the float rounding of other batches. Returns the labels
    initialised on this rank."""
    import torch.distributed as dist

    from ..training.distributed import communication_device

    layer = model.output_layer
    embedding_options = dict(tokenizer=tokenizer, pooling=model.config.pooling, normalize=model.config.normalize)
    embedding_options |= {name: options[name] for name in ("batch_size", "max_length", "device") if name in options}
    embedding_options.setdefault("device", model.device)
    # The center, and a last entry that is 1 where rank 0 computed it: a rank 0 that fails says so in the broadcast
    # the others wait in, and every rank raises, where the others would wait for it forever.
    message = torch.zeros(layer.in_features + 1, dtype=torch.float32)
    error = None
    if dist.get_rank(group) == 0:
        try:
            kept = _with_text(label_texts, "they keep their default initial weights")
            message[:-1] = _center(model, label_texts, kept, embedding_options).float().cpu()
            message[-1] = 1
        except Exception as caught:  # raised below, once the other ranks know
            error = caught
    message = message.to(communication_device(group))
    dist.broadcast(message, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    if error is not None:
        raise error
    message = message.cpu()
    if message[-1] != 1:
        raise RuntimeError(
            "Rank 0 failed to embed the label texts' mean (the center of the label-text initialisation): its error "
            "is in its output."
        )
    ids = layer.output_labels[layer.output_labels >= 0].cpu()
    texts = [label_texts[i] for i in ids.tolist()]
    return init_from_label_texts_(model, texts, tokenizer=tokenizer, label_ids=ids, center=message[:-1], **options)


def init_from_label_texts_(
    model,
    label_texts: Sequence[str],
    *,
    tokenizer,
    label_ids: ArrayLike | None = None,
    scale: float = 1.0,
    center: torch.Tensor | bool = True,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int | None = None,
    device: str | torch.device | None = None,
    show_progress: bool = True,
) -> int:
    """Starts the head rows and tail weights of a `HasteForExtremeClassification`'s labels from its own encoder's
    embedding of their texts (`HasteOutputLayer.init_from_label_embeddings_`), streamed a block at a time
    (`label_text_embeddings`).

    Args:
        model: the model; its encoder, pooling and `normalize` embed the texts as they embed inputs.
        label_texts: the text of each label of `label_ids` (by default of every label, by id).
        tokenizer: the model's tokenizer.
        label_ids: the labels to initialise (default: all of them).
        scale: row norm relative to the default initialisation's (see `init_from_label_embeddings_`).
        center: the embedding subtracted from every label's: True, the mean embedding of `CENTER_SAMPLE` of
            `label_texts` drawn at random (seeded; all of them when fewer); an embedding `[d]` (e.g. the mean over
            another label set's texts, for a few labels added to it); False, none.
        batch_size: label texts encoded at once (with a fast tokenizer, the token budget of a batch: see
            `label_text_embeddings`).
        max_length: tokens per text (default: the tokenizer's `model_max_length`).
        device: where the encoder runs (default: where the model is); the encoder stays there afterwards.
        show_progress: show a tqdm progress bar over the texts.

    Returns:
        How many labels were initialised: labels with a blank text keep their weights (a warning counts them).
    """
    layer = model.output_layer
    ids = torch.arange(layer.label_count) if label_ids is None else _as_int64_vector(label_ids, "label_ids")
    if len(label_texts) != ids.numel():
        raise ValueError(
            f"`label_texts` has {len(label_texts):,} texts for {ids.numel():,} labels: give one text per label."
        )
    kept = _with_text(label_texts, "they keep their default initial weights")
    options = dict(
        tokenizer=tokenizer,
        pooling=model.config.pooling,
        normalize=model.config.normalize,
        batch_size=batch_size,
        max_length=max_length,
        device=model.device if device is None else device,
        show_progress=show_progress,
    )
    # A sequence (the texts, or references to those kept), not a generator: its length sizes the progress bar, whose
    # percentage the command line's error tests tell from a message.
    texts = label_texts if kept.numel() == len(label_texts) else [label_texts[i] for i in kept.tolist()]
    blocks = label_text_embeddings(model.encoder, texts, **options)
    if center is True and kept.numel() <= CENTER_SAMPLE:  # the center's sample is every text: embedded once for both
        blocks = list(blocks)
        center = _mean(blocks, kept.numel(), layer.in_features)
    elif center is True:
        center = _center(model, label_texts, kept, options)
    start = 0
    for block in blocks:
        layer.init_from_label_embeddings_(
            ids[kept[start : start + block.shape[0]]],
            block,
            scale=scale,
            center=center if center is not False else None,
        )
        start += block.shape[0]
    return kept.numel()
