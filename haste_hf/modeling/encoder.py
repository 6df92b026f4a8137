# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The encoder under a HASTE model: pooling its token states, checkpointing the activations of any encoder family,
and loading it without the pooler HASTE does not use.

Flat and Hub-exportable, as `modeling_haste`: imports only torch, transformers and its exportable siblings.
"""

import functools
import inspect

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import logging


def pool_hidden_states(states: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`[B, T, d]` token states -> `[B, d]`: the first token (`"cls"`), the masked mean (`"mean"`) or the
    last attended token (`"last_token"`, whichever side the padding is on)."""
    if pooling == "cls":
        return states[:, 0]
    if pooling == "mean":
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(1) / mask.sum(1).clamp(min=1)
    positions = torch.arange(states.shape[1], device=states.device)
    last = (attention_mask.bool() * positions).argmax(dim=1)
    return states[torch.arange(states.shape[0], device=states.device), last]


def layer_stack(encoder: nn.Module) -> nn.ModuleList | None:
    """The encoder's stack of transformer blocks: its largest `nn.ModuleList` of modules of one class."""
    stacks = [
        module
        for module in encoder.modules()
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(layer) for layer in module}) == 1
    ]
    return max(stacks, key=lambda stack: sum(param.numel() for param in stack.parameters()), default=None)


def checkpointed_forward(self, *args, **kwargs):
    """A block's forward that keeps only its inputs and recomputes its activations in the backward."""
    forward = functools.partial(type(self).forward, self)
    if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
        return self._gradient_checkpointing_func(forward, *args, **kwargs)
    return forward(*args, **kwargs)


def pooler_free_kwargs(encoder_config) -> dict:
    """Drops the pooler where the architecture has an optional one: HASTE pools itself, and an unused
    pooler breaks DDP with gradient checkpointing."""
    from transformers import AutoModel  # here: loading the auto classes registers HASTE's, which imports this module

    model_class = AutoModel._model_mapping[type(encoder_config)]
    return (
        {"add_pooling_layer": False}
        if "add_pooling_layer" in inspect.signature(model_class.__init__).parameters
        else {}
    )


class _HeldLoadReports:
    """A logging filter that holds back transformers' load report (a table of the keys a checkpoint lacked or held
    in excess)."""

    def __init__(self):
        self.records = []

    def filter(self, record) -> bool:
        if "LOAD REPORT" in str(record.msg):
            self.records.append(record)
            return False
        return True


def load_pretrained_encoder(name, **kwargs) -> PreTrainedModel:
    """`AutoModel.from_pretrained(name)`, without transformers' load report when all it says is that the checkpoint's
    pooler was not loaded: `pooler_free_kwargs` leaves the pooler out on purpose. Any other report is shown."""
    from transformers import AutoModel

    report_logger = logging.get_logger("transformers.modeling_utils")
    held = _HeldLoadReports()
    report_logger.addFilter(held)
    try:
        encoder, info = AutoModel.from_pretrained(name, output_loading_info=True, **kwargs)
    finally:
        report_logger.removeFilter(held)
    only_the_pooler = (
        not info["missing_keys"]
        and not info["mismatched_keys"]
        and all(key.startswith("pooler.") for key in info["unexpected_keys"])
    )
    if not only_the_pooler:
        for record in held.records:
            report_logger.handle(record)
    return encoder


def encoder_token_limit(encoder) -> int | None:
    """The most tokens `encoder` reads: its `max_position_embeddings`, less the positions RoBERTa-style encoders
    reserve below their first (padding index + 1); None when its config names no limit."""
    limit = getattr(encoder.config, "max_position_embeddings", None)
    if limit is None:
        return None
    positions = getattr(getattr(encoder, "embeddings", None), "position_embeddings", None)
    if isinstance(positions, nn.Embedding) and positions.padding_idx is not None:
        limit -= positions.padding_idx + 1
    return limit


__all__ = [
    "checkpointed_forward",
    "encoder_token_limit",
    "layer_stack",
    "load_pretrained_encoder",
    "pool_hidden_states",
    "pooler_free_kwargs",
]
