# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""Millions of texts to encoder batches at the speed of the hardware, for the label embeddings (training texts with
their label ids, or labels' own texts).

A chunk of `CHUNK_TEXTS` texts is tokenised by the Rust tokenizer behind a fast tokenizer in one call (its threads
share the cores; the GIL is released), unpadded; its token ids become one flat array and one length per text
(CSR), with no per-text padding in Python. The texts are then sorted by length and cut into batches of at most a
token budget of padded tokens, so the padding is small and short texts go many to a batch. The chunk's arrays
(tokens, where each sorted text came from in the chunk, the texts' label ids in the same order) go to the device in
one pinned, non-blocking copy each; a batch's padded `input_ids` and `attention_mask` are gathered there from the
flat tokens (`padded_inputs`). Chunks are prepared in threads ahead of the encoder (`embeddings.prepared_ahead`),
and from `tokenizer_processes.MIN_TEXTS` texts tokenised in worker processes (`tokenizer_processes`).
"""

import bisect
from dataclasses import dataclass

import numpy as np
import torch

from .tokenizer_processes import csr_rows, encode_rows


# Texts tokenised (and sorted by length) at once: the sort leaves little padding at this size, and a chunk's
# arrays stay small (about 7 MB of tokens for titles).
CHUNK_TEXTS = 16384
# A `model_max_length` at or above this is transformers' "no limit" marker: such texts are not truncated.
_NO_LIMIT = 10**9


def fast_backend(tokenizer, max_length: int | None):
    """A copy of the Rust tokenizer of a fast `tokenizer`, truncating as `tokenizer(texts, truncation=True,
    max_length=max_length)` does and padding nothing; None when `tokenizer` has none (a slow tokenizer) or has
    no padding token (then the tokenizer's own call explains)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token_id is None:
        return None
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(backend.to_str())
    copy.no_padding()
    limit = max_length if max_length is not None else tokenizer.model_max_length
    if limit is None or limit >= _NO_LIMIT:
        copy.no_truncation()
    else:
        copy.enable_truncation(int(limit), direction=getattr(tokenizer, "truncation_side", "right"))
    return copy


def gives_token_types(backend) -> bool:
    """Whether `backend` gives a single text any non-zero token type id. A single text's type ids come from the
    post-processor's template alone (the text's pieces and the special tokens each have their fixed id), never from
    the text: one probe answers for every text, where reading each text's `type_ids` would turn every token's into a
    Python int (a quarter of a chunk's Python time, under the GIL the encoder's thread needs)."""
    return any(backend.encode("a").type_ids)


def reorder_rows(flat: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The values of CSR rows `order` (an index array), concatenated in that order."""
    new_lengths = lengths[order]
    starts = np.cumsum(lengths) - lengths
    new_starts = np.cumsum(new_lengths) - new_lengths
    return flat[np.repeat(starts[order] - new_starts, new_lengths) + np.arange(int(new_lengths.sum()))]


def length_batches(sorted_lengths: np.ndarray, token_budget: int) -> list[int]:
    """Bounds `[0, b1, ..., n]` of consecutive batches of texts sorted by ascending length, each as long as its
    padded size (texts x its longest text, at least 1) stays within `token_budget` (a text longer than the budget
    goes alone)."""
    lengths = np.maximum(sorted_lengths, 1).tolist()
    bounds, start, count = [0], 0, len(lengths)
    while start < count:
        # (end - start) x lengths[end - 1] grows with `end`: the last end within the budget, by bisection.
        fits = bisect.bisect_right(
            range(start + 1, count + 1), token_budget, key=lambda e: (e - start) * lengths[e - 1]
        )
        start += max(1, fits)
        bounds.append(start)
    return bounds


@dataclass
class TokenChunk:
    """A chunk of texts, sorted by token length, and their positive label ids (if any), as flat arrays (CSR) ready
    for the device.

    Attributes:
        tokens: int64 `[T]` the texts' token ids, text after text in sorted order.
        token_types: int64 `[T]` their token type ids, or None (all zero: the encoder's default).
        lengths: int64 `[n]` tokens of each text (sorted ascending); `starts` their offsets into `tokens`.
        order: int64 `[n]` the index in the chunk (as given) of each sorted text: row `order[i]` of the chunk's
            embeddings in the given order is sorted text `i`'s.
        labels: int64 `[P]` the positive label ids of each text, text after text in sorted order;
            `label_rows` int64 `[P]` the (sorted) text each belongs to; `label_bounds` (numpy, `[n + 1]`) where each
            text's labels start. All three None for a chunk of texts without labels.
        bounds: the batches, as bounds into the sorted texts (`length_batches`).
        host_lengths: `lengths` as numpy (a batch's padded length is read on the host, without a device sync).
    """

    tokens: torch.Tensor
    token_types: torch.Tensor | None
    lengths: torch.Tensor
    starts: torch.Tensor
    order: torch.Tensor
    labels: torch.Tensor | None
    label_rows: torch.Tensor | None
    label_bounds: np.ndarray | None
    bounds: list[int]
    host_lengths: np.ndarray

    @property
    def size(self) -> int:
        return len(self.host_lengths)

    def to(self, device: torch.device) -> "TokenChunk":
        def move(tensor):
            return None if tensor is None else tensor.to(device, non_blocking=True)

        return TokenChunk(
            *(
                move(t)
                for t in (
                    self.tokens,
                    self.token_types,
                    self.lengths,
                    self.starts,
                    self.order,
                    self.labels,
                    self.label_rows,
                )
            ),
            self.label_bounds,
            self.bounds,
            self.host_lengths,
        )

    def padded_inputs(self, start: int, end: int, pad_id: int, pad_type_id: int, left: bool) -> dict:
        """The encoder's inputs of sorted texts `[start, end)`: `input_ids`, `attention_mask` (and `token_type_ids`)
        `[end - start, longest]`, padded on the left or the right, gathered on the chunk's device."""
        width = max(1, int(self.host_lengths[end - 1]))
        lengths = self.lengths[start:end].unsqueeze(1)
        columns = torch.arange(width, device=self.tokens.device)
        shift = (width - lengths) if left else torch.zeros_like(lengths)
        mask = (columns >= shift) & (columns < shift + lengths)
        index = (self.starts[start:end].unsqueeze(1) + columns - shift).clamp_(0, max(0, self.tokens.numel() - 1))
        gathered = self.tokens[index] if self.tokens.numel() else torch.zeros_like(index)
        inputs = {"input_ids": gathered.masked_fill(~mask, pad_id), "attention_mask": mask.long()}
        if self.token_types is not None:
            inputs["token_type_ids"] = self.token_types[index].masked_fill(~mask, pad_type_id)
        return inputs


def tokenize_chunk(backend, texts: list[str], token_budget: int, *, with_types: bool = False, **options) -> TokenChunk:
    """`texts` tokenised by `backend` (see `fast_backend`) in this process, as a `TokenChunk` (`token_chunk`)."""
    return token_chunk(*encode_rows(backend, texts, with_types), token_budget, **options)


def token_chunk(
    flat_tokens: np.ndarray,
    lengths: np.ndarray,
    flat_types: np.ndarray | None,
    token_budget: int,
    *,
    label_lists: list | None = None,
    label_count: int | None = None,
    pin: bool = False,
) -> TokenChunk:
    """Texts tokenised (`tokenizer_processes.encode_rows`: their flat token ids, lengths and token types or None),
    sorted by length and cut into batches of at most `token_budget` padded tokens, as a `TokenChunk`: with
    `label_lists`, each text's label ids (in `[0, label_count)`, checked) beside it; with `pin`, in pinned memory for
    non-blocking copies."""
    order = np.argsort(lengths, kind="stable")
    sorted_lengths = lengths[order]

    def tensor(array):
        out = torch.from_numpy(np.ascontiguousarray(array))
        return out.pin_memory() if pin else out

    labels = label_rows = label_bounds = None
    if label_lists is not None:
        flat_labels, label_lengths = csr_rows(label_lists)
        if flat_labels.size and (flat_labels.min() < 0 or flat_labels.max() >= label_count):
            raise ValueError(
                f"Label ids must be in [0, {label_count}) (`label_count`); got ids in [{flat_labels.min()}, "
                f"{flat_labels.max()}]. Remove padding values such as -100."
            )
        sorted_label_lengths = label_lengths[order]
        labels = tensor(reorder_rows(flat_labels, label_lengths, order))
        label_rows = tensor(np.repeat(np.arange(lengths.size, dtype=np.int64), sorted_label_lengths))
        label_bounds = np.concatenate([[0], np.cumsum(sorted_label_lengths)])

    return TokenChunk(
        tokens=tensor(reorder_rows(flat_tokens, lengths, order)),
        token_types=None if flat_types is None else tensor(reorder_rows(flat_types, lengths, order)),
        lengths=tensor(sorted_lengths),
        starts=tensor(np.cumsum(sorted_lengths) - sorted_lengths),
        order=tensor(order.astype(np.int64, copy=False)),
        labels=labels,
        label_rows=label_rows,
        label_bounds=label_bounds,
        bounds=length_batches(sorted_lengths, token_budget),
        host_lengths=sorted_lengths,
    )
