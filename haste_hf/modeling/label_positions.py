# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The label-position map of HASTE's output layer, and the checks of the labels it maps.

`output_labels` `[n_head + K*G]` names the label id at each output position (-1 at the padding slots that trail
the last group); its inverse, the position of each label id, is derived from it. Labels reach the layer as padded
positive ids `[B, P]` (`LABEL_PADDING_ID` padding) or as a dense multi-hot `[B, L]`; ids are mapped to positions
here, and checked without a host synchronization on accelerators.

Flat and Hub-exportable, as `output_layer`: imports only torch and its exportable siblings.
"""

import numbers
import os

import torch

from .configuration_haste import DEFAULT_HEAD_LABEL_FRACTION, head_label_count_for
from .defaults import LABEL_PADDING_ID


# Check label ids on accelerators too, at the cost of a device synchronization per step (CPU tensors are
# always checked; the collator checks them when given `label_count`).
VALIDATE_LABELS = os.environ.get("HASTE_HF_VALIDATE", "0") == "1"


def default_output_labels(shape) -> torch.Tensor:
    """Positions in label-id order for a layer or configuration `shape` (its `label_count`,
    `head_label_count`, `tail_group_count`, `group_size`): label l at position l, padding slots -1."""
    padded = shape.head_label_count + shape.tail_group_count * shape.group_size
    output_labels = torch.full((padded,), -1, dtype=torch.int64)
    output_labels[: shape.label_count] = torch.arange(shape.label_count)
    return output_labels


def output_label_range(source, label_count: int, start: int, stop: int) -> torch.Tensor:
    """Positions `[start, stop)` of the output labels of `source`, built without the `[L]` whole (8 GB of int64 at
    10^9 labels, which a rank of a sharded run need not hold): a `LabelLayout` (head ids, then the tail order, then
    -1 padding), a whole `output_labels` tensor, or None for label-id order (`default_output_labels`)."""
    if isinstance(source, torch.Tensor):  # padded with -1 where it stops at the last label
        out = torch.full((stop - start,), -1, dtype=torch.int64)
        part = source[start:stop]
        return out.index_copy_(0, torch.arange(part.numel()), part.to("cpu", torch.int64))
    positions = torch.arange(start, stop, dtype=torch.int64)
    if source is None:
        return positions.masked_fill_(positions >= label_count, -1)
    head_ids, tail_order = torch.as_tensor(source.head_ids), torch.as_tensor(source.tail_order)
    heads, labels = head_ids.numel(), label_count
    out = torch.full((stop - start,), -1, dtype=torch.int64)
    in_head = slice(min(start, heads), min(stop, heads))
    out[in_head.start - start : in_head.stop - start] = head_ids[in_head]
    in_tail = slice(max(start, heads), max(min(stop, labels), heads))
    out[in_tail.start - start : in_tail.stop - start] = tail_order[in_tail.start - heads : in_tail.stop - heads]
    return out


def output_labels_of_head_ids(head_labels, label_count: int) -> torch.Tensor:
    """The ids by position `[L]` of a layer whose head holds the label ids `head_labels` (in that order) and whose
    tail takes the others in id order, after checking that they are label ids, each once."""
    head_ids = torch.as_tensor(head_labels)
    if (
        isinstance(head_labels, (bool, numbers.Real))
        or (head_ids.dtype.is_floating_point and head_ids.numel())  # `[]` is float: no head, as 0
        or head_ids.dtype == torch.bool
    ):
        # `True` would be a 1-label head, 2.5 label 2: neither is what was meant.
        raise ValueError(
            f"`head_labels` must be a number of labels (an integer), head label ids or a LabelLayout, got "
            f"{head_labels!r}."
        )
    head_ids = head_ids.to(torch.int64).flatten()
    in_head = torch.zeros(label_count, dtype=torch.bool)
    if head_ids.numel() and (int(head_ids.min()) < 0 or int(head_ids.max()) >= label_count):
        raise ValueError(f"`head_labels` holds ids outside [0, {label_count}): give label ids of this layer.")
    in_head[head_ids] = True
    if int(in_head.sum()) != head_ids.numel():
        raise ValueError("`head_labels` lists a label twice: give each head label once.")
    return torch.cat([head_ids, torch.nonzero(~in_head).squeeze(1)])


def check_each_label_once(parts, label_count: int, message: str) -> None:
    """Raises `ValueError(message)` unless the id vectors `parts` together hold every id in `[0, label_count)` exactly
    once; a bool per label (1 GB at 10^9 labels), where concatenating and sorting them took five `[L]` int64 arrays."""
    seen = torch.zeros(label_count, dtype=torch.bool)
    total = 0
    for part in parts:
        for rows in range(0, part.numel(), 1 << 24):
            ids = part[rows : rows + (1 << 24)].to(torch.int64)
            total += ids.numel()
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= label_count):
                raise ValueError(message)
            seen[ids] = True
    if total != label_count or not bool(seen.all()):  # L ids that reach all L labels: none repeats
        raise ValueError(message)


def output_labels_from_frequencies(shape, label_frequencies, tail_order=None) -> torch.Tensor:
    """Output positions for a layer or configuration `shape`: the `head_label_count` most frequent labels
    (ties by id), then the tail labels in `tail_order` (an ordering of exactly the tail labels, e.g. a
    semantic grouping), or by decreasing frequency when `tail_order` is None; padding slots -1."""
    frequencies = torch.as_tensor(label_frequencies)
    if frequencies.shape != (shape.label_count,):
        raise ValueError(
            f"`label_frequencies` must have one count per label ({shape.label_count}), got shape {tuple(frequencies.shape)}."
        )
    by_frequency = torch.sort(-frequencies.to(torch.float64), stable=True).indices
    head, tail = by_frequency[: shape.head_label_count], by_frequency[shape.head_label_count :]
    if tail_order is not None:
        grouped_by = getattr(tail_order, "group_size", None)
        if grouped_by is not None and grouped_by != shape.group_size:
            raise ValueError(
                f"`label_grouping` groups the tail in groups of {grouped_by} labels, but the model's `group_size` is "
                f"{shape.group_size}: its groups would straddle the model's. Pass group_size={grouped_by}, or "
                f"group the tail again with group_size={shape.group_size}."
            )
        tail_order = torch.as_tensor(getattr(tail_order, "order", tail_order), dtype=torch.int64)
        if tail_order.shape != tail.shape or not torch.equal(tail_order.sort().values, tail.sort().values):
            raise ValueError(
                "`label_grouping` must order exactly the tail labels (all labels but the "
                f"{shape.head_label_count} most frequent), each once; got {tail_order.numel()} ids for "
                f"{tail.numel()} tail labels. Group the tail labels returned by the head/tail split."
            )
        tail = tail_order
    output_labels = default_output_labels(shape)
    output_labels[: shape.label_count] = torch.cat([head, tail])
    return output_labels


def check_layout(layout, label_count: int | None = None, group_size: int | None = None) -> tuple[int, int]:
    """`(label_count, head_label_count)` of a `LabelLayout` (head ids, tail order, G), after checking that it
    agrees with `label_count` and `group_size` where those are given and holds every label once."""
    if label_count is not None and label_count != layout.label_count:
        raise ValueError(
            f"`label_count` ({label_count}) differs from the layout's ({layout.label_count}): the layout was made for other data."
        )
    if group_size is not None and group_size != layout.group_size:
        raise ValueError(
            f"`group_size` ({group_size}) differs from the layout's G ({layout.group_size}): its tail order groups "
            f"{layout.group_size} labels at a time. Leave `group_size` out, or make a layout with G = {group_size}."
        )
    head_ids = torch.as_tensor(layout.head_ids)
    check_each_label_once(
        (head_ids.cpu(), torch.as_tensor(layout.tail_order).cpu()),
        layout.label_count,
        f"The layout's head and tail must hold every label id in [0, {layout.label_count}) exactly once.",
    )
    return layout.label_count, head_ids.numel()


def label_positions_of(output_labels: torch.Tensor, label_count: int) -> torch.Tensor:
    """Inverse of `output_labels`: the output position of each label id `[label_count]`. Padding slots (-1) scatter
    into one spare entry past the last label, which is dropped: ops whose shapes do not depend on the data, so that
    a traced graph (torch.compile, torch.export) derives the map too."""
    targets = torch.where(output_labels >= 0, output_labels, label_count)
    positions = torch.full((label_count + 1,), -1, dtype=torch.int64, device=output_labels.device)
    positions.scatter_(0, targets, torch.arange(output_labels.shape[0], device=output_labels.device))
    return positions[:label_count]


def is_integer_multi_hot(labels: torch.Tensor, label_count: int) -> bool:
    """Whether integer `labels` `[B, label_count]` of 0s and 1s (what `MultiLabelBinarizer` gives) is a multi-hot.

    Read as padded ids, such a tensor would list labels 0 and 1 over and over, which no collator produces;
    with 2 labels or fewer both readings are plausible, so the caller must say which one it means."""
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.shape[1] != label_count:
        return False
    if not bool(((labels == 0) | (labels == 1)).all()):
        return False
    if label_count <= 2:
        raise ValueError(
            f"Integer `labels` of shape {tuple(labels.shape)} holding only 0 and 1 read both as a multi-hot and as "
            f"padded label ids: pass a multi-hot as bool or float, or pad label ids with {LABEL_PADDING_ID}."
        )
    return True


def check_labels(invalid: torch.Tensor, message: str) -> None:
    """Raises `ValueError(message)` where `invalid` has a True: at once on the CPU (or with
    `HASTE_HF_VALIDATE=1`), else without a host synchronization (nor graph break) per step, stopping the
    run on the device."""
    if VALIDATE_LABELS or (invalid.device.type == "cpu" and not torch.compiler.is_compiling()):
        if bool(invalid.any()):
            raise ValueError(message)
    else:
        torch._assert_async(~invalid.any(), message)


def positive_positions(labels: torch.Tensor, label_positions: torch.Tensor, label_count: int) -> torch.Tensor:
    """Padded positive label ids `[B, P]` -> their output positions (`label_positions`, by label id), -1 for
    padding (repeats kept: every loss path counts a position once)."""
    if not labels.dtype.is_signed:
        raise ValueError(
            f"`labels` of dtype {labels.dtype} cannot hold the {LABEL_PADDING_ID} padding of label ids: pass "
            "padded ids as int64, or a multi-hot as float or bool."
        )
    valid = labels != LABEL_PADDING_ID
    invalid = (valid & (labels < 0)) | (labels >= label_count)
    check_labels(
        invalid,
        f"`labels` holds ids outside [0, {label_count}) other than the padding value {LABEL_PADDING_ID}: "
        f"pass positive label ids padded with {LABEL_PADDING_ID}, or a dense [batch, label_count] multi-hot.",
    )
    ids = labels.masked_fill(~valid | invalid, 0).long()
    # A share of a sharded layer passes a function of the ids (it holds no [L] map): see `ShardedOutputLayer`.
    return torch.where(valid, label_positions(ids) if callable(label_positions) else label_positions[ids], -1)


def dense_labels(labels: torch.Tensor, batch_size: int, label_count: int) -> torch.Tensor | None:
    """`labels` as a dense multi-hot (float, bool, or an integer one of 0s and 1s read as bool), or None
    for padded ids; raises on a malformed `labels`."""
    if labels.dim() != 2 or labels.shape[0] != batch_size:
        raise ValueError(
            f"`labels` must be 2-D with one row per example, got shape {tuple(labels.shape)}: positive label ids "
            f"padded with {LABEL_PADDING_ID} (haste_hf.XMCDataCollator packs per-example label-id lists so), or a "
            "dense [batch, label_count] multi-hot."
        )
    if is_integer_multi_hot(labels, label_count):
        return labels.bool()
    if not (labels.dtype.is_floating_point or labels.dtype == torch.bool):
        return None
    if labels.shape[1] != label_count:
        raise ValueError(
            f"A dense multi-hot `labels` needs {label_count} columns, got {labels.shape[1]}: "
            f"pass one column per label, or padded positive ids (int64, {LABEL_PADDING_ID} padding)."
        )
    if labels.dtype != torch.bool:
        check_labels(
            ~((labels >= 0) & (labels <= 1)), "A dense float `labels` must hold targets in [0, 1] (NaN is not one)."
        )
    return labels


def label_count_and_head(
    label_count, head_label_count, head_label_fraction, layout, label_frequencies, label_grouping, config_kwargs
) -> tuple[int, int]:
    """`(label_count, head_label_count)` of `HasteForExtremeClassification.from_encoder_pretrained`'s arguments, after
    their checks; a `layout` also sets `config_kwargs["group_size"]`."""
    if layout is not None:
        given = [
            name
            for name, value in (
                ("label_frequencies", label_frequencies),
                ("label_grouping", label_grouping),
                ("head_label_fraction", head_label_fraction),
            )
            if value is not None
        ]
        if given:
            raise ValueError(f"`layout` already fixes the head and the tail order: leave out {', '.join(given)}.")
        label_count, layout_head = check_layout(layout, label_count, config_kwargs.get("group_size"))
        if head_label_count is not None and head_label_count != layout_head:
            raise ValueError(
                f"`head_label_count` ({head_label_count}) differs from the layout's head ({layout_head} labels): leave it out."
            )
        head_label_count, config_kwargs["group_size"] = layout_head, layout.group_size
    elif label_count is None:
        raise ValueError("Give `label_count` (the number of labels), or a `layout` that holds it.")
    if head_label_count is not None and head_label_fraction is not None:
        raise ValueError("Give `head_label_count` or `head_label_fraction`, not both.")
    if head_label_count is None and head_label_fraction is None:
        head_label_fraction = DEFAULT_HEAD_LABEL_FRACTION
    if head_label_fraction is not None:
        if not 0.0 <= head_label_fraction <= 1.0:
            raise ValueError(f"`head_label_fraction` must lie in [0, 1], got {head_label_fraction}.")
        head_label_count = head_label_count_for(head_label_fraction, label_count)
    return label_count, head_label_count


__all__ = [
    "label_count_and_head",
    "VALIDATE_LABELS",
    "check_labels",
    "check_layout",
    "default_output_labels",
    "dense_labels",
    "is_integer_multi_hot",
    "label_positions_of",
    "output_labels_from_frequencies",
    "positive_positions",
]
