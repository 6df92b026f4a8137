# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Label embeddings: for semantic grouping, a label's embedding is the normalised mean of the (normalised) encoder
embeddings of its positive training instances, blended with its own text's embedding for labels seen rarely
(`blend_label_texts_`); `label_text_embeddings` streams labels' own texts through the encoder (`text_init` starts the
output layer's rows from them)."""

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from itertools import chain, islice, repeat
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..modeling.configuration_haste import POOLING_MODES, check_one_of, default_pooling
from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH, LABEL_PADDING_ID
from ..modeling.encoder import pool_hidden_states
from ..modeling.logging_utils import get_logger
from . import tokenizer_processes
from .grouping import ArrayLike, _default_device
from .token_batches import CHUNK_TEXTS, TokenChunk, fast_backend, gives_token_types, token_chunk
from .tokenizer_processes import encode_rows


logger = get_logger(__name__)


class TextEmbedder(NamedTuple):
    """`prepare(list[str])`, a batch's CPU work (tokenising), safe to run in another thread; `embed(prepared) ->
    [B, d]`; `restore()`, undoing changes to the encoder; and the tokenizer of a transformers encoder (None for an
    encoder that embeds texts itself)."""

    prepare: Callable
    embed: Callable
    restore: Callable
    tokenizer: object = None


def _text_embedder(encoder, tokenizer, pooling: str | None, max_length: int | None, device: torch.device):
    """The `TextEmbedder` of `encoder`."""
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

        # On GPUs with bf16, the encoder runs under bf16 autocast, as training does: several times the speed of
        # float32 over millions of texts, and the grouping compares the embeddings in bf16 anyway.
        autocast_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()

        def prepare(texts: list[str]):
            return tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")

        def embed(inputs) -> torch.Tensor:
            inputs = {name: value.to(device) for name, value in inputs.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast_bf16):
                outputs = encoder(**inputs)
            hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
            return pool_hidden_states(hidden.float(), inputs["attention_mask"], pooling)

        return TextEmbedder(prepare, embed, lambda: encoder.train(was_training), tokenizer)

    if pooling is not None:
        logger.warning(
            f"`pooling={pooling!r}` is ignored: it applies to a transformers encoder, this one embeds texts itself."
        )
    if callable(getattr(encoder, "encode", None)):  # a sentence-transformers model (duck-typed)

        def embed(texts: list[str]) -> torch.Tensor:
            return torch.as_tensor(
                encoder.encode(texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False)
            )

        return TextEmbedder(_as_is, embed, lambda: None)

    if callable(encoder):
        return TextEmbedder(_as_is, (lambda texts: torch.as_tensor(encoder(texts))), lambda: None)

    raise TypeError(
        "`encoder` must be a transformers model (with `tokenizer`), a model name, an object with an `encode` "
        f"method (sentence-transformers) or a callable mapping a list of texts to embeddings; got {type(encoder)}."
    )


def _as_is(texts: list[str]) -> list[str]:
    return texts


# Tokenising is most of an embedding pass on a GPU: a fast tokenizer turns about 3K texts a second into tensors on
# one core, the encoder embeds many times that. Batches are tokenised ahead in threads (the Rust tokenizer lets go
# of the GIL) while the encoder runs.
PREPARE_THREADS = min(8, os.cpu_count() or 1)


def prepared_ahead(
    prepare, batches: Iterable[list], texts_of=_as_is, threads: int | None = None
) -> Iterator[tuple[list, object]]:
    """`(batch, prepare(texts_of(batch)))` for each batch, in order, with up to 2 x `threads` (default
    `PREPARE_THREADS`) batches prepared ahead.

    The first batch is prepared in the calling thread before any other: a fast tokenizer's first call sets its
    truncation and padding on the Rust tokenizer, which fails ("Already borrowed") while another thread encodes.
    """
    batches = iter(batches)
    threads = PREPARE_THREADS if threads is None else threads
    if prepare is _as_is or threads == 1:
        yield from ((batch, prepare(texts_of(batch))) for batch in batches)
        return
    first = next(batches, None)
    if first is None:
        return
    first_prepared = prepare(texts_of(first))
    with ThreadPoolExecutor(threads) as pool:
        pending = deque([(first, None)])
        for batch in batches:
            pending.append((batch, pool.submit(lambda batch: prepare(texts_of(batch)), batch)))
            if len(pending) == 2 * threads:
                batch, prepared = pending.popleft()
                yield batch, first_prepared if prepared is None else prepared.result()
        while pending:
            batch, prepared = pending.popleft()
            yield batch, first_prepared if prepared is None else prepared.result()


def _batched(iterable: Iterable, size: int, ramp: int = 0):
    """Lists of `size` items of `iterable`; with `ramp`, the first `ramp` lists are `size / 2**ramp`, ..., `size / 2`
    items: the first chunks, tokenised while many others are, reach the encoder in a fraction of the time."""
    iterator = iter(iterable)
    sizes = chain((max(1, size >> shift) for shift in range(ramp, 0, -1)), repeat(size))
    while batch := list(islice(iterator, next(sizes))):
        yield batch


def _embed_batch(embed, prepared, texts: list[str], device: torch.device) -> torch.Tensor:
    """`embed(prepared)` (the batch `texts`, prepared) as float32 `[len(texts), d]` on `device`, after checking it
    is one embedding per text."""
    embeddings = embed(prepared)
    if embeddings.ndim != 2 or embeddings.shape[0] != len(texts):
        raise ValueError(
            f"The encoder must return one embedding per text: expected shape [{len(texts)}, d], "
            f"got {tuple(embeddings.shape)}."
        )
    return embeddings.to(device=device, dtype=torch.float32)


# On a GPU, the fewest padded tokens of a batch of the label embeddings' fast path. A MiniLM forward costs the host
# milliseconds of Python launches whatever its size, and the GPU embeds a batch of 8,192 tokens (64 x 128) in less:
# at 8.6M labels the host's launches, not the GPU, set the pace (2.02M training texts at 15.7K a second, the end
# of the pass at 29K a second once the tokenizer threads let go of the GIL). 65,536 tokens is ~1,240 titles.
MIN_GPU_TOKEN_BUDGET = 65536


def embedding_token_budget(batch_size: int, max_length: int | None, device: torch.device) -> int:
    """The padded tokens of a batch of `compute_label_embeddings`' fast path: `batch_size` x `max_length` (128 when
    None), at least `MIN_GPU_TOKEN_BUDGET` on a GPU."""
    budget = batch_size * (max_length or DEFAULT_MAX_LENGTH)
    return max(budget, MIN_GPU_TOKEN_BUDGET) if device.type == "cuda" else budget


def _check_batch_size(batch_size) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer, got {batch_size!r}.")


def label_text_embeddings(
    encoder: "str | Callable | torch.nn.Module",
    texts: Iterable[str],
    *,
    tokenizer=None,
    pooling: str | None = None,
    normalize: bool = False,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int | None = DEFAULT_MAX_LENGTH,
    device: str | torch.device | None = None,
    show_progress: bool = True,
) -> Iterator[torch.Tensor]:
    """The encoder's embeddings of `texts` (labels' own texts, e.g. `XMCDataset.label_texts`), a block at a time.

    Yields float32 `[b, d]` tensors on `device` whose rows follow one another in the order of `texts`: millions of
    labels stream through in the memory of one block, and the consumer writes each block where it belongs
    (`HasteOutputLayer.init_from_label_embeddings_`, `blend_label_texts_`). With a fast tokenizer a block is a chunk
    of texts (`token_batches.CHUNK_TEXTS`, the first ones smaller) embedded as `compute_label_embeddings` embeds
    training texts: tokenised ahead in threads, sorted by length, in batches of `embedding_token_budget` padded
    tokens, and put back in the order of `texts`; otherwise a block is a batch of `batch_size` texts.

    Args:
        encoder, tokenizer, pooling, max_length, device: as in `compute_label_embeddings`; a transformers
            encoder runs in eval mode and gets its training mode back when the iteration ends.
        texts: the texts, read once (any iterable; its `len`, when it has one, sizes the progress bar).
        normalize: scale each embedding to unit norm (what a HASTE model whose config has `normalize` computes).
        batch_size: texts encoded at once; with a fast tokenizer, the padded tokens of a batch as in
            `compute_label_embeddings`: short texts go many to a batch.
        show_progress: show a tqdm progress bar over the texts.
    """
    # Checked here, at the call; the encoder is touched only once the embeddings are asked for.
    if pooling is not None:
        check_one_of("pooling", pooling, POOLING_MODES)
    _check_batch_size(batch_size)
    try:
        num_texts = len(texts)
    except TypeError:
        num_texts = None
    return _embedded_blocks(
        encoder,
        texts,
        tokenizer,
        pooling,
        normalize,
        batch_size,
        max_length,
        _default_device(device),
        num_texts,
        show_progress,
    )


@torch.no_grad()
def _embedded_blocks(
    encoder, texts, tokenizer, pooling, normalize, batch_size, max_length, device, num_texts, show_progress
) -> Iterator[torch.Tensor]:
    embedder = _text_embedder(encoder, tokenizer, pooling, max_length, device)
    progress = tqdm(total=num_texts, desc="Label texts", unit="text", disable=not show_progress)
    try:
        backend = None if embedder.tokenizer is None else fast_backend(embedder.tokenizer, max_length)
        if backend is not None:
            token_budget = embedding_token_budget(batch_size, max_length, device)
            blocks = _chunks_in_order(embedder, backend, texts, token_budget, device, progress)
        else:
            blocks = _batches_in_order(embedder, texts, batch_size, device, progress)
        for embeddings in blocks:
            yield F.normalize(embeddings, dim=1) if normalize else embeddings
    finally:
        embedder.restore()
        progress.close()


def _batches_in_order(embedder, texts, batch_size, device, progress) -> Iterator[torch.Tensor]:
    """The embeddings of `texts`, a batch of `batch_size` texts at a time in their order (an encoder that embeds
    texts itself, or a tokenizer without a Rust backend)."""
    for batch, prepared in prepared_ahead(embedder.prepare, _batched(texts, batch_size)):
        yield _embed_batch(embedder.embed, prepared, batch, device)
        progress.update(len(batch))


def _chunks_in_order(embedder, backend, texts, token_budget, device, progress) -> Iterator[torch.Tensor]:
    """The embeddings of `texts`, a chunk at a time (`_token_batch_embeddings`), each chunk's rows put back in the
    order of its texts: one `[chunk, d]` float32 block on `device` is all the memory it holds."""
    block = None
    batches = _token_batch_embeddings(embedder, backend, texts, token_budget, device, total=progress.total)
    for chunk, start, end, embeddings in batches:
        if start == 0:
            block = embeddings.new_empty(chunk.size, embeddings.shape[1])
        block[chunk.order[start:end]] = embeddings
        progress.update(end - start)
        if end == chunk.size:
            yield block


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
        tokenizer: tokenizer of a transformers `encoder`. A fast one (with a Rust backend) tokenises chunks of
            texts ahead in threads, and each chunk is sorted by length (`token_batches`).
        batch_size: number of texts encoded at once; with a fast tokenizer, the padded tokens of a batch
            (`embedding_token_budget`: `batch_size` x `max_length`, 128 when None; on a GPU at least
            `MIN_GPU_TOKEN_BUDGET`): short texts, sorted by length, go many to a batch.
        max_length: truncation length for a transformers `encoder`.
        pooling: `"cls"` (first token), `"mean"` (masked mean) or `"last_token"` (last attended token), for a
            transformers `encoder`; by default the pooling a HASTE model over this encoder uses
            (`configuration_haste.default_pooling`), so the labels are embedded as the model embeds texts.
        device: where the encoder and the accumulator live; defaults to CUDA when available.
        show_progress: show a tqdm progress bar over the texts.

    Returns:
        `[label_count, d]` float32 tensor on `device`, rows of unit norm. A label without any positive instance
        gets the zero vector; `group_labels` places such labels after all semantically grouped ones.
    """
    if pooling is not None:
        check_one_of("pooling", pooling, POOLING_MODES)
    _check_batch_size(batch_size)
    if isinstance(label_count, bool) or not isinstance(label_count, (int, np.integer)) or label_count < 1:
        raise ValueError(f"`label_count` must be a positive integer, got {label_count!r}.")
    device = _default_device(device)
    embedder = _text_embedder(encoder, tokenizer, pooling, max_length, device)
    try:
        num_texts = len(texts)
    except TypeError:
        num_texts = None
    pairs = zip(texts, labels, strict=True)
    progress = tqdm(total=num_texts, desc="Label embeddings", unit="text", disable=not show_progress)
    started = time.perf_counter()
    try:
        backend = None if embedder.tokenizer is None else fast_backend(embedder.tokenizer, max_length)
        if backend is not None:
            token_budget = embedding_token_budget(batch_size, max_length, device)
            sums = _sums_of_token_chunks(embedder, backend, pairs, label_count, token_budget, device, progress)
        else:
            sums = _sums_of_batches(embedder, pairs, label_count, batch_size, device, progress)
    finally:
        embedder.restore()
        progress.close()
    if sums is None:
        raise ValueError("`texts` is empty: label embeddings need at least one training instance.")
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    logger.info(
        f"Label embeddings: {progress.n:,} texts embedded in {seconds:.1f} s ({progress.n / seconds:,.0f} a second)."
    )
    # normalize(sum / count) == normalize(sum), in place: a copy of `[label_count, d]` would double the peak (13 GB
    # at 8.6M labels and d = 384). Norms clamped as F.normalize does: all-zero rows (labels without positives) stay zero.
    return sums.div_(sums.norm(dim=1, keepdim=True).clamp_min_(1e-12))


def _sums_of_batches(embedder, pairs, label_count, batch_size, device, progress) -> torch.Tensor | None:
    """The label sums of unit text embeddings, a batch of `batch_size` texts at a time in their order (an encoder
    that embeds texts itself, or a tokenizer without a Rust backend)."""
    sums = None
    batches = prepared_ahead(
        embedder.prepare, _batched(pairs, batch_size), texts_of=lambda batch: [text for text, _ in batch]
    )
    for batch_index, (batch, prepared) in enumerate(batches):
        batch_texts = [text for text, _ in batch]
        label_lists = [np.asarray(ids, dtype=np.int64).reshape(-1) for _, ids in batch]
        flat_labels = np.concatenate(label_lists)
        if flat_labels.size and (flat_labels.min() < 0 or flat_labels.max() >= label_count):
            raise ValueError(
                f"Label ids in batch {batch_index} must be in [0, {label_count}) (`label_count`); got ids in "
                f"[{flat_labels.min()}, {flat_labels.max()}]. Remove padding values such as {LABEL_PADDING_ID}."
            )
        instance_embeddings = F.normalize(_embed_batch(embedder.embed, prepared, batch_texts, device), dim=1)
        if sums is None:
            sums = torch.zeros(label_count, instance_embeddings.shape[1], dtype=torch.float32, device=device)
        rows = torch.repeat_interleave(
            torch.arange(len(batch_texts), device=device),
            torch.as_tensor([len(ids) for ids in label_lists], device=device),
        )
        sums.index_add_(0, torch.from_numpy(flat_labels).to(device), instance_embeddings[rows])
        progress.update(len(batch))
    return sums


# The first chunks of the fast path are smaller (1,024, 2,048, 4,096, 8,192 texts, then `CHUNK_TEXTS`): the
# threads tokenise their chunks together, and at 8.6M labels the encoder had embedded 30K texts after 13 s.
CHUNK_RAMP = 4


def _token_batch_embeddings(
    embedder, backend, items, token_budget, device, label_count: int | None = None, total: int | None = None
) -> Iterator[tuple[TokenChunk, int, int, torch.Tensor]]:
    """`(chunk, start, end, embeddings)` of every batch of `items` (texts, or with `label_count` `(text, label ids)`
    pairs), chunk by chunk of `CHUNK_TEXTS` items tokenised ahead in threads by the Rust `backend` (from
    `tokenizer_processes.MIN_TEXTS` items, `total`, in worker processes), each chunk sorted by length into batches
    of at most `token_budget` padded tokens (`token_batches`) and moved to `device`; `embeddings` float32 `[end -
    start, d]` of the chunk's sorted texts `[start, end)` (`chunk.order` says where each came from, `chunk.labels`
    what labels it has)."""
    tokenizer = embedder.tokenizer
    left = getattr(tokenizer, "padding_side", "right") == "left"
    pad_type_id = getattr(tokenizer, "pad_token_type_id", 0) or 0
    with_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ()) and gives_token_types(backend)
    workers = tokenizer_processes.process_count() if (total or 0) >= tokenizer_processes.MIN_TEXTS else 0
    processes = tokenizer_processes.TokenizerProcesses(backend, workers, with_types) if workers else None
    with processes or nullcontext():

        def prepare(chunk):
            label_lists = None
            if label_count is not None:
                chunk, label_lists = [text for text, _ in chunk], [ids for _, ids in chunk]
            rows = processes.encode(chunk) if processes else encode_rows(backend, chunk, with_types)
            options = dict(label_lists=label_lists, label_count=label_count, pin=device.type == "cuda")
            return token_chunk(*rows, token_budget, **options)

        chunks = _batched(items, CHUNK_TEXTS, ramp=CHUNK_RAMP)
        for _, host_chunk in prepared_ahead(prepare, chunks, threads=workers or None):
            chunk = host_chunk.to(device)
            for start, end in zip(chunk.bounds, chunk.bounds[1:]):
                inputs = chunk.padded_inputs(start, end, tokenizer.pad_token_id, pad_type_id, left)
                yield chunk, start, end, _embed_batch(embedder.embed, inputs, range(end - start), device)


def _sums_of_token_chunks(embedder, backend, pairs, label_count, token_budget, device, progress) -> torch.Tensor | None:
    """The label sums of unit text embeddings, a batch of `_token_batch_embeddings` at a time, its texts' label ids
    on the device beside its tokens: each batch's embeddings are added to the sums of its texts' labels in one
    `index_add_`."""
    sums = None
    batches = _token_batch_embeddings(
        embedder, backend, pairs, token_budget, device, label_count=label_count, total=progress.total
    )
    for chunk, start, end, embeddings in batches:
        embeddings = F.normalize(embeddings, dim=1)
        if sums is None:
            sums = torch.zeros(label_count, embeddings.shape[1], dtype=torch.float32, device=device)
        first, last = int(chunk.label_bounds[start]), int(chunk.label_bounds[end])
        if last > first:
            sums.index_add_(0, chunk.labels[first:last], embeddings[chunk.label_rows[first:last] - start])
        progress.update(end - start)  # a batch at a time: a chunk can take minutes on a CPU
    return sums


def _with_text(texts: Sequence[str], what: str) -> torch.Tensor:
    """Indices into `texts` of the texts that are not blank, with a warning naming `what` when some are: a blank text
    embeds as the special tokens alone and says nothing of its label."""
    # Blank: empty or all whitespace (what `str.strip` removes), read by C loops over the texts (8.6M in a second).
    has_text = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)) > 0
    has_text &= ~np.fromiter(map(str.isspace, texts), dtype=bool, count=len(texts))
    has_text = torch.from_numpy(has_text)
    blank = has_text.numel() - int(has_text.sum())
    if blank:
        logger.warning(f"{blank:,} of {has_text.numel():,} labels have a blank text: {what}.")
    return has_text.nonzero().squeeze(1)


@torch.no_grad()
def blend_label_texts_(
    embeddings: torch.Tensor,
    label_texts: Sequence[str],
    label_frequencies: ArrayLike,
    below: int,
    encoder: "str | Callable | torch.nn.Module",
    **embedding_options,
) -> int:
    """Mixes its text into the embedding of each label with fewer than `below` training points, in place.

    `e_l <- normalize(w_l e_l + (1 - w_l) t_l)` with `w_l = count_l / below` and `t_l` the unit embedding of label
    `l`'s text: a label seen once or twice is grouped by its text as much as by its few points, and a label without
    any point (a zero `e_l`, which `group_labels` would put last, ungrouped) by its text alone. Labels with a
    blank text keep their embedding.

    Args:
        embeddings: `[label_count, d]` unit (or zero) rows, as `compute_label_embeddings` returns them.
        label_texts: the text of each label, by id.
        label_frequencies: `[label_count]` training points of each label.
        below: the count from which a label's embedding is left alone (>= 1).
        encoder, **embedding_options: the encoder and the other arguments of `label_text_embeddings` (tokenizer,
            pooling, max_length, batch_size, device, show_progress); embed the texts as `embeddings` were embedded.

    Returns:
        How many labels were blended.
    """
    if isinstance(below, bool) or not isinstance(below, (int, np.integer)) or below < 1:
        raise ValueError(f"`below` (the training count under which label texts count) must be >= 1, got {below!r}.")
    counts = torch.as_tensor(np.asarray(label_frequencies), dtype=torch.int64).reshape(-1)
    if not embeddings.shape[0] == counts.numel() == len(label_texts):
        raise ValueError(
            f"`embeddings` ({embeddings.shape[0]} rows), `label_frequencies` ({counts.numel()}) and `label_texts` "
            f"({len(label_texts)}) must each have one entry per label."
        )
    rare = (counts < below).nonzero().squeeze(1)
    rare = rare[_with_text([label_texts[i] for i in rare.tolist()], "they are grouped by their training points alone")]
    weights = (counts[rare].to(torch.float32) / below).unsqueeze(1)
    start = 0
    for block in label_text_embeddings(
        encoder, (label_texts[i] for i in rare.tolist()), normalize=True, **embedding_options
    ):
        ids = rare[start : start + block.shape[0]].to(embeddings.device)
        weight = weights[start : start + block.shape[0]].to(embeddings.device)
        mixed = weight * embeddings[ids].float() + (1 - weight) * block.to(embeddings.device)
        embeddings[ids] = F.normalize(mixed, dim=1).to(embeddings.dtype)
        start += block.shape[0]
    return rare.numel()


def resolve_tokenizer(model, tokenizer):
    """`tokenizer`, or the one saved with the model; refuses a model with no tokenizer to embed the texts."""
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    source = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
    try:
        if not source:
            raise OSError("the model was not loaded from a folder")
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise ValueError(
            f"`tokenizer`: the model has no tokenizer to embed the label texts ({str(error).splitlines()[0]}); pass "
            "tokenizer=AutoTokenizer.from_pretrained(<its folder or encoder>)."
        ) from None
