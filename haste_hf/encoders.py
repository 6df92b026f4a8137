# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The recipe's encoder steps: load an encoder (a transformers model or a SentenceTransformer's transformer), read
its pooling, and check a `max_length` against what it reads. `haste_hf.recipe` re-exports them."""

from .modeling.configuration_haste import default_pooling
from .modeling.model_sources import resolve_encoder
from .modeling.modeling_haste import encoder_token_limit


def load_encoder(name: str):
    """`(encoder, tokenizer)` of a model id or path, the encoder in float32; of a SentenceTransformer folder or Hub
    id, its transformer (`encoder_pooling` gives its pooling)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from .modeling.sentence_transformer_encoder import sentence_transformer_folder

    path = resolve_encoder(name)
    sentence_transformer = sentence_transformer_folder(path)
    where = {"subfolder": sentence_transformer[0]} if sentence_transformer and sentence_transformer[0] else {}
    return AutoModel.from_pretrained(path, dtype=torch.float32, **where), AutoTokenizer.from_pretrained(path, **where)


def encoder_pooling(name: str, encoder, pooling: str | None = None) -> str:
    """The pooling the recipe trains the encoder `name` (loaded as `encoder`) with: a SentenceTransformer's own
    (unless `pooling` is given; its Normalize left out with a warning, as `from_encoder_pretrained` leaves it out),
    another model's `pooling` or its family's default."""
    from .modeling.sentence_transformer_encoder import sentence_transformer_folder, warn_normalize_left_out

    sentence_transformer = sentence_transformer_folder(resolve_encoder(name), pooling)
    if sentence_transformer is None:
        return pooling or default_pooling(encoder.config)
    _, folder_pooling, ends_in_normalize = sentence_transformer
    if ends_in_normalize:
        warn_normalize_left_out(f"The SentenceTransformer in {name}")
    return folder_pooling


def check_max_length(encoder, max_length: int, name: str) -> None:
    """Raises a `ValueError` when texts of `max_length` tokens exceed what `encoder` (named `name`) reads: the first
    long text would crash the run, and the saved tokenizer would keep the bad length for `predict` and `pipeline`."""
    limit = encoder_token_limit(encoder)
    if limit is not None and max_length > limit:
        raise ValueError(
            f"`max_length` (--max-length) is {max_length}, but the encoder {name} reads at most {limit} tokens "
            f"(its max_position_embeddings): pass --max-length {limit} or less."
        )


__all__ = ["check_max_length", "encoder_pooling", "load_encoder"]
