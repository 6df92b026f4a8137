# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The checks of the encoder's inputs (tokens there, and no more than its positions) and of the output layer: its
arguments, its ranked scores, a loaded layer's invariants (supports in range and distinct, every label placed once)
and the shape a checkpoint's layer must share with the model it loads into. Exported with the modeling file (a
sibling, imported with a single dot)."""

import torch
import torch.distributed as dist

from . import label_positions
from .label_names import LabelNameTable


def _check_ranked_scores(top_scores: torch.Tensor) -> None:
    """Raises a `ValueError` when a ranked score is NaN: `topk` puts NaN first, so a NaN among the best scores means
    one among all of them. Checked on the CPU (or with `HASTE_HF_VALIDATE=1`) in a single process; on accelerators
    a check would cost a device synchronization per batch, and in a process group one rank raising alone would
    leave the others waiting in their next collective: there NaN scores are returned as they are, first, for the
    caller to check once gathered (as `haste-hf predict` and `evaluate` do)."""
    in_group = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    checked = (label_positions.VALIDATE_LABELS or top_scores.device.type == "cpu") and not (
        torch.compiler.is_compiling() or in_group
    )
    if checked and bool(top_scores.isnan().any()):
        raise ValueError(
            "The scores hold NaN (NaN or infinite `features`, or weights): the labels cannot be ranked. Check "
            "the encoder's output and the model's weights."
        )


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer{' or None' if allow_none else ''}, got {value!r}.")


def check_layer_arguments(
    in_features,
    label_count,
    head_label_count,
    group_size,
    fan_in,
    head_projection_dim,
    tail_projection_dim,
) -> None:
    """Raises a `ValueError` naming the first `HasteOutputLayer` argument out of range."""
    for name, value in (
        ("in_features", in_features),
        ("label_count", label_count),
        ("group_size", group_size),
        ("fan_in", fan_in),
    ):
        _positive_int(name, value)
    _positive_int("head_projection_dim", head_projection_dim, allow_none=True)
    _positive_int("tail_projection_dim", tail_projection_dim, allow_none=True)
    if isinstance(head_label_count, bool) or not 0 <= head_label_count <= label_count:
        raise ValueError(
            f"The head must hold between 0 and label_count={label_count} labels, got {head_label_count!r}."
        )
    if head_label_count < label_count and fan_in > (tail_projection_dim or in_features):
        raise ValueError(
            f"`fan_in` ({fan_in}) exceeds the tail's input size ({tail_projection_dim or in_features}): a group cannot "
            "connect to more distinct features than exist. Lower `fan_in` or raise `tail_projection_dim`."
        )


def check_encoder_inputs(input_ids, inputs_embeds, token_limit: int | None) -> None:
    """Raises a `ValueError` naming the fix when there are no tokens to encode, or more than the encoder's
    `token_limit` positions. A stock Trainer removes the raw `text` column (no argument of the model) before it
    collates: the error names the collator that tokenizes it, not the encoder's own complaint."""
    if input_ids is None and inputs_embeds is None:
        raise ValueError(
            "HasteForExtremeClassification got no `input_ids`: tokenize the texts first (`dataset.map(tokenizer)`), "
            "or collate raw text with `haste_hf.XMCDataCollator(tokenizer)` (with a stock Trainer, "
            "`remove_unused_columns=False` so that the `text` column reaches it)."
        )
    if input_ids is not None and token_limit is not None and input_ids.shape[1] > token_limit:
        raise ValueError(
            f"`input_ids` holds texts of {input_ids.shape[1]} tokens, and the encoder reads at most {token_limit}: "
            f"truncate them (`truncation=True, max_length={token_limit}`, to the tokenizer or the pipeline)."
        )


def check_features(features, in_features: int) -> None:
    """Raises a `ValueError` unless `features` is `[batch, in_features]` (shapes only: no device sync)."""
    if not isinstance(features, torch.Tensor) or features.dim() != 2 or features.shape[1] != in_features:
        shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
        raise ValueError(f"`features` must be a [batch, {in_features}] tensor, got {shape}.")


def check_output_layer_invariants(layer, source="the output layer") -> None:
    """`HasteOutputLayer.check_invariants` of `layer`."""
    if layer.tail is not None:
        supports = layer.tail.supports
        if supports.numel() and (int(supports.min()) < 0 or int(supports.max()) >= layer.tail.in_features):
            raise ValueError(
                f"{source}: tail supports hold feature indices in [{int(supports.min())}, {int(supports.max())}], "
                f"outside [0, {layer.tail.in_features}): the weights file is corrupt or belongs to another model."
            )
        ordered = supports.sort(dim=1).values
        repeated = (ordered[:, 1:] == ordered[:, :-1]).any(dim=1)
        if bool(repeated.any()):
            group = int(torch.nonzero(repeated)[0])
            raise ValueError(
                f"{source}: tail group {group} lists a feature twice in its support {supports[group].tolist()}: "
                "the weights file is corrupt."
            )
    placed = layer.output_labels[: layer.label_count]
    if (
        bool((placed < 0).any())
        or bool((layer.output_labels[layer.label_count :] != -1).any())
        or int(placed.max()) >= layer.label_count
        or placed.unique().numel() != layer.label_count
    ):
        raise ValueError(
            f"{source}: `output_labels` must place each of the {layer.label_count} labels exactly once (padding -1): "
            "the weights file is corrupt or belongs to another model."
        )


def _output_layer_shape(config) -> tuple:
    """What the output layer's tensors and their meaning depend on, by a `HasteConfig` (a checkpoint's layer loads
    into a model of the same shape only)."""
    return (
        config.encoder.hidden_size,
        config.label_count,
        config.head_label_count,
        config.group_size,
        config.fan_in,
        config.head_projection_dim,
        config.tail_projection_dim,
        config.tail_bias,
    )


def _describe(shape: tuple) -> str:
    hidden, labels, head, group_size, fan_in, head_projection, tail_projection, tail_bias = shape
    described = f"{labels} labels, head {head}, G {group_size}, F {fan_in}, on {hidden} features"
    for name, value in (
        ("head_projection_dim", head_projection),
        ("tail_projection_dim", tail_projection),
        ("tail_bias", tail_bias or None),
    ):
        if value is not None:
            described += f", {name} {value}"
    return described


def checked_label_names(label_names, label_count: int, logger) -> list[str] | None:
    """`label_names` as strings, an empty one as `LABEL_{id}`; refuses a count other than `label_count` and warns (once,
    through `logger`) of empty and repeated names (see `HasteForExtremeClassification.set_label_names`)."""
    if label_names is not None and (isinstance(label_names, str) or len(label_names) != label_count):
        count = "a string" if isinstance(label_names, str) else f"{len(label_names)} entries"
        raise ValueError(f"`label_names` has {count} for {label_count} labels: give a list of one name per label.")
    if isinstance(label_names, LabelNameTable):
        # Kept compact (10^9 names would be 80 GB of strings): empty names read LABEL_<id>; repeats are not looked
        # for, which would take a table of every name.
        return label_names.as_label_names()
    if label_names is not None:
        label_names = [str(name) for name in label_names]
        empty = [label_id for label_id, name in enumerate(label_names) if not name.strip()]
        for label_id in empty:
            label_names[label_id] = f"LABEL_{label_id}"
        first_id, repeated = {}, []
        for label_id, name in enumerate(label_names):
            if name in first_id:
                repeated.append(f"{name!r} for labels {first_id[name]} and {label_id}")
            first_id.setdefault(name, label_id)
        if empty or repeated:
            logger.warning_once(
                f"`label_names`: {len(empty)} empty name(s), named LABEL_<id> (e.g. label {empty[:1]}); "
                f"{len(repeated)} repeated name(s) (e.g. {repeated[:1]}), which predictions show alike. Give "
                "each label a distinct name to tell them apart."
            )
    return label_names


__all__ = ["check_features", "checked_label_names", "check_layer_arguments", "check_output_layer_invariants"]
