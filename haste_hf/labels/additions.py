# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Labels added to a trained model, from their texts and optionally a few examples, without retraining it.

New labels take the next ids (`L, L + 1, ...`). By default (`head=None`) they take new rows of the dense head where
it reads the tail's features (no projections: a head row is mapped from every trained label's text, all features its
own; on deps and tags, 3 seeds, the head beat the tail in every mode). With projections (a head row would be learnt
from the head's few frequent labels alone) or without a head they go to the tail (`head=False` asks for it): they
first fill the padding slots of the last tail group, the ones that fit its support best, then form groups of their
own whose supports are the features where their predicted weights are largest. A head row costs `d` weights and `d`
multiply-adds a text against a tail label's F: 10^6 labels added to a 10^7-label model with d = 384 grow the head
by 1.5 GB in float32 and each text's scoring by 3.8 x 10^8 multiply-adds (the tail's 1.28 x 10^9 at F = 128).
Existing labels keep their weights, their supports and the order of their groups, so their scores stay
bit-identical; the output positions stay "head, then tail groups, padding last", so the folder saves, loads,
serves and exports as any other.

Each new label starts from the weights the trained model's own labels say its text should have (`priors.py`: a
ridge map from the trained labels' texts, the model's label names, to their weights on the branch; on the tail with
negatives, plus a copy of the text's own features, its weight and the scale distilled on trained labels). Given
negatives (training texts tagged with none of the new labels), a MAP logistic fit of the new weights alone follows:
its positives (its own text and its examples) against every other negative, pulled toward the text's weights, the
encoder and every existing weight frozen; the rest of the negatives calibrate (a fit pushes its own negatives down,
so a level set on them would undercount its false positives on texts it never saw). Last, each new label's level is calibrated (`priors.py`) to the frequency of the
trained labels whose texts are nearest its own: with negatives, the bias at which its BCE over the training texts is
stationary (its positives standing for that fraction of them, the negatives for the rest), as training leaves a
trained label's bias; without, an offset that makes its summed sigmoid scores on a sample of the trained labels'
texts what those nearest trained labels have there. A model without label names falls back to the text's embedding
as the direction, scaled to the trained weights' mean norm.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers.utils.logging import is_progress_bar_enabled

from ..modeling.defaults import DEFAULT_EVAL_BATCH_SIZE, DEFAULT_MAX_LENGTH
from ..modeling.output_layer import HasteOutputLayer
from ..modeling.sparse_ops import group_sparse_linear
from . import priors
from .embeddings import label_text_embeddings, resolve_tokenizer
from .grouping import group_labels
from .priors import calibrate_new_labels, fallback_start, fit_new_labels


DEFAULT_FIT_STEPS = 200
DEFAULT_FIT_LEARNING_RATE = 0.01


@dataclass
class NewLabelPlacement:
    """Where the new labels (indexed 0..n-1 in the order given) go.

    Attributes:
        head: new labels taking head rows, in row order.
        filled: new labels taking the padding slots of the last existing tail group, in slot order.
        groups: `[m, G]` new labels of each new tail group (-1: padding slots of the last one).
        supports: int32 `[m, F]` the supports of the new groups.
    """

    head: list[int]
    filled: list[int]
    groups: torch.Tensor
    supports: torch.Tensor


# ------------------------------------------------------------------------------------------------ input checks


def _check_texts(value, argument: str, allow_empty_list: bool = False) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"`{argument}` must be a list of texts, got {type(value).__name__}.")
    if not value and not allow_empty_list:
        raise ValueError(f"`{argument}` is empty: give at least one text.")
    for index, text in enumerate(value):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"`{argument}[{index}]` is {text!r}: every text must be a non-empty string.")
    return list(value)


def existing_label_names(model) -> list[str]:
    """The model's label names, `LABEL_{id}` where it has none."""
    names = model.label_names
    return list(names) if names is not None else [f"LABEL_{label}" for label in range(model.config.label_count)]


def check_new_names(model, texts: list[str], names) -> list[str] | None:
    """The names of the new labels (the texts where the model has names and none are given; None: the model's
    `LABEL_{id}` placeholders), refusing duplicates and names the model already has."""
    if names is None:
        if model.label_names is None:
            return None
        names, argument = list(texts), "texts"
    else:
        names, argument = _check_texts(names, "names"), "names"
        if len(names) != len(texts):
            raise ValueError(f"`names` has {len(names)} entries for {len(texts)} texts: give one name per new label.")
    seen = {}
    for index, name in enumerate(names):
        if name in seen:
            raise ValueError(
                f"`{argument}` lists {name!r} twice (entries {seen[name]} and {index}): each new label needs its own name."
            )
        seen[name] = index
    existing = {name: label for label, name in enumerate(existing_label_names(model))}
    for name in names:
        if name in existing:
            raise ValueError(
                f"`{argument}`: {name!r} is already label {existing[name]} of this model; give the new label another name."
            )
    return names


def check_examples(examples, texts: list[str], names: list[str] | None, label_count: int) -> list[list[str]]:
    """`examples` as one list of example texts per new label: given so (aligned with `texts`), or as a mapping from
    a new label's name or id (`label_count + i`) to its texts."""
    count = len(texts)
    if examples is None:
        return [[] for _ in range(count)]
    if isinstance(examples, dict):
        by_name = {name: index for index, name in enumerate(names or [])}
        aligned = [[] for _ in range(count)]
        for key, values in examples.items():
            if isinstance(key, int) and not isinstance(key, bool):
                if 0 <= key < label_count:
                    raise ValueError(
                        f"`examples`: label {key} exists already; examples are for the new labels "
                        f"(ids {label_count} to {label_count + count - 1})."
                    )
                index = key - label_count
                if not 0 <= index < count:
                    raise ValueError(
                        f"`examples`: {key} is not the id of a new label (ids {label_count} to {label_count + count - 1})."
                    )
            elif key in by_name:
                index = by_name[key]
            else:
                raise ValueError(
                    f"`examples`: {key!r} is not one of the new labels: key examples by a new label's name or id."
                )
            aligned[index] = _check_texts(values, f"examples[{key!r}]", allow_empty_list=True)
        return aligned
    if isinstance(examples, (list, tuple)) and len(examples) == count:
        return [
            _check_texts(values, f"examples[{index}]", allow_empty_list=True) for index, values in enumerate(examples)
        ]
    raise ValueError(
        f"`examples` must be a list of {count} lists of texts (one per new label) or a mapping from new label names or "
        f"ids to texts, got {type(examples).__name__}"
        + (f" of {len(examples)}" if hasattr(examples, "__len__") else "")
        + "."
    )


# ------------------------------------------------------------------------------------------------ embeddings


def embed_texts(
    model,
    tokenizer,
    texts: list[str],
    *,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> torch.Tensor:
    """The model's pooled features `[len(texts), d]` (float32, on the model's device) of `texts`: what its output
    layer reads, so a label's text lands where the texts it should score high land (`label_text_embeddings` over
    the model's encoder, pooling and normalisation)."""
    batches = label_text_embeddings(
        model.encoder,
        texts,
        tokenizer=tokenizer,
        pooling=model.config.pooling,
        normalize=model.config.normalize,
        batch_size=batch_size,
        max_length=max_length,
        device=model.device,
        show_progress=is_progress_bar_enabled(),  # as transformers' own bars: `disable_progress_bar()` hides it
    )
    return torch.cat(list(batches))


@torch.no_grad()
def branch_features(layer: HasteOutputLayer, features: torch.Tensor, branch: str) -> torch.Tensor:
    """`features` through the `branch` ("head" or "tail") projection, if it has one, in float32."""
    projection = getattr(layer, f"{branch}_projection")
    if projection is None:
        return features.float()
    return projection(features.to(projection.weight.dtype)).float()


# ------------------------------------------------------------------------------------------------ placement


def default_placement_is_head(layer: HasteOutputLayer) -> bool:
    """Where `add_labels(head=None)` puts new labels: in the dense head where it reads the tail's features (neither
    branch has a projection) or there is no tail; else in the tail."""
    if layer.head is None:
        return False
    shared = layer.head_projection is None and layer.tail_projection is None
    return shared or layer.tail is None


def supports_for(directions: torch.Tensor, fan_in: int) -> torch.Tensor:
    """int32 `[F]` sorted features where the unit `directions` `[n, d]` of a group's labels are largest in sum of squares."""
    mass = F.normalize(directions, dim=1).square().sum(dim=0)
    return mass.topk(fan_in).indices.sort().values.int()


def place_new_labels(layer: HasteOutputLayer, count: int, tail_directions: torch.Tensor | None, seed: int):
    """The `NewLabelPlacement` of `count` new labels: in the head when `tail_directions` is None, else in the tail
    by their directions `[count, d_tail]`."""
    empty = torch.empty(0, layer.group_size, dtype=torch.int64), torch.empty(0, layer.fan_in, dtype=torch.int32)
    if tail_directions is None:
        return NewLabelPlacement(list(range(count)), [], *empty)
    free_slots = layer.tail_group_count * layer.group_size - layer.tail_label_count
    filled = []
    if free_slots:
        last_support = layer.tail.supports[-1].long().to(tail_directions.device)
        fit = F.normalize(tail_directions, dim=1)[:, last_support].square().sum(dim=1)
        filled = fit.topk(min(free_slots, count)).indices.tolist()
    rest = torch.tensor(sorted(set(range(count)) - set(filled)), dtype=torch.int64)
    if not rest.numel():
        return NewLabelPlacement([], filled, *empty)
    group_size = layer.group_size
    if rest.numel() > group_size:
        directions = F.normalize(tail_directions[rest], dim=1).cpu()
        order = group_labels(
            directions, torch.arange(rest.numel()), group_size, "semantic", seed=seed, show_progress=False
        )
        rest = rest[order.order]
    group_count = -(-rest.numel() // group_size)
    groups = torch.full((group_count * group_size,), -1, dtype=torch.int64)
    groups[: rest.numel()] = rest
    groups = groups.view(group_count, group_size)
    supports = torch.stack(
        [
            supports_for(tail_directions[members[members >= 0].to(tail_directions.device)], layer.fan_in).cpu()
            for members in groups
        ]
    )
    return NewLabelPlacement([], filled, groups, supports)


# ------------------------------------------------------------------------------------------------ the new weights


class NewLabelWeights(torch.nn.Module):
    """The trainable weights of the new labels only: head rows (and biases), the weights of the filled padding
    slots on the last group's support, the weights of the new groups on theirs. `logits` scores every new label
    (in the order given) from the branch features; `pair_logits` only the (text, label) pairs asked for."""

    def __init__(self, layer: HasteOutputLayer, placement: NewLabelPlacement, count: int):
        super().__init__()
        self.count = count
        self.head_labels = torch.tensor(placement.head, dtype=torch.int64)
        self.filled_labels = torch.tensor(placement.filled, dtype=torch.int64)
        self.group_labels = placement.groups
        device = layer.output_labels.device
        self.head_weight = self.head_bias = None
        if placement.head:
            self.head_weight = torch.nn.Parameter(
                torch.zeros(len(placement.head), layer.head.weight.shape[1], device=device)
            )
            if layer.head.bias is not None:
                self.head_bias = torch.nn.Parameter(torch.zeros(len(placement.head), device=device))
        # New tail labels always get a bias (their level, `priors.calibrate_new_labels`): where the tail has none,
        # the extended layer gains one, zero for the existing labels, whose scores stay bit-identical.
        with_bias = layer.tail is not None and (
            layer.tail.bias is not None or bool(placement.filled or len(placement.groups))
        )
        self.filled_weight = torch.nn.Parameter(torch.zeros(len(placement.filled), layer.fan_in, device=device))
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        self.filled_support = layer.tail.supports[-1].long().clone() if placement.filled else empty
        self.group_weight = torch.nn.Parameter(torch.zeros(*placement.groups.shape, layer.fan_in, device=device))
        self.group_supports = placement.supports.to(device)
        self.tail_bias = torch.nn.Parameter(torch.zeros(count, device=device)) if with_bias else None
        # Each new label's (kind, row): 0 head row, 1 filled slot, 2 slot of the flattened new groups.
        kind = torch.full((count,), -1, dtype=torch.int64)
        row = torch.full((count,), -1, dtype=torch.int64)
        for label_kind, labels in ((0, self.head_labels), (1, self.filled_labels)):
            kind[labels], row[labels] = label_kind, torch.arange(labels.numel())
        flat = self.group_labels.flatten()
        kind[flat[flat >= 0]], row[flat[flat >= 0]] = 2, torch.nonzero(flat >= 0).squeeze(1)
        self.kind, self.row = kind.to(device), row.to(device)

    def tail_slots(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`([m, F] supports, [m, F] weights)` of the new tail labels `labels` (filled slots or slots of the new
        groups), gathered for these alone."""
        kind, row = self.kind[labels], self.row[labels]
        supports = torch.zeros(labels.numel(), self.filled_weight.shape[1], dtype=torch.int64, device=kind.device)
        weights = torch.zeros(labels.numel(), self.filled_weight.shape[1], device=kind.device)
        filled, grouped = kind == 1, kind == 2
        if filled.any():
            supports[filled] = self.filled_support.to(kind.device)
            weights = weights.masked_scatter(filled.unsqueeze(1), self.filled_weight[row[filled]])
        if grouped.any():
            supports[grouped] = self.group_supports[row[grouped] // self.group_labels.shape[1]].long()
            slots = self.group_weight.view(-1, self.group_weight.shape[-1])[row[grouped]]
            weights = weights.masked_scatter(grouped.unsqueeze(1), slots)
        return supports, weights

    def logits(self, head_x: torch.Tensor | None, tail_x: torch.Tensor | None) -> torch.Tensor:
        batch_size = (head_x if head_x is not None else tail_x).shape[0]
        out = torch.zeros(batch_size, self.count, device=self.kind.device)
        if self.head_weight is not None:
            scores = F.linear(head_x, self.head_weight, self.head_bias)
            out = out.index_copy(1, self.head_labels.to(out.device), scores)
        if self.filled_labels.numel():
            scores = tail_x[:, self.filled_support] @ self.filled_weight.T
            out = out.index_copy(1, self.filled_labels.to(out.device), scores)
        flat = self.group_labels.flatten()
        if flat.numel():
            scores = group_sparse_linear(tail_x, self.group_weight, self.group_supports)
            slots = torch.nonzero(flat >= 0).squeeze(1).to(out.device)
            out = out.index_copy(1, flat[flat >= 0].to(out.device), scores[:, slots])
        if self.tail_bias is not None:
            out = out + torch.where(self.kind == 0, 0.0, self.tail_bias)
        return out

    def pair_logits(self, head_x, tail_x, rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The logits of new label `labels[i]` on text `rows[i]`, without scoring the other pairs."""
        out = torch.zeros(rows.numel(), device=self.kind.device)
        kind, row = self.kind[labels], self.row[labels]
        in_head = kind == 0
        if in_head.any():
            bias = 0 if self.head_bias is None else self.head_bias[row[in_head]]
            out = out.masked_scatter(in_head, (head_x[rows[in_head]] * self.head_weight[row[in_head]]).sum(1) + bias)
        if not in_head.all():
            supports, tail_weights = self.tail_slots(labels[~in_head])
            bias = 0 if self.tail_bias is None else self.tail_bias[labels[~in_head]]
            out = out.masked_scatter(
                ~in_head, (tail_x[rows[~in_head].unsqueeze(1), supports] * tail_weights).sum(1) + bias
            )
        return out

    def logits_of(self, head_x: torch.Tensor | None, tail_x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        """`[n, m]` the logits of the new labels `labels` on every text: `logits(...)[:, labels]` without scoring
        the others (a calibration of 10^6 new labels on 2,048 texts held all their scores at once: 16 GB)."""
        in_head = self.kind[labels] == 0
        out = torch.zeros((head_x if head_x is not None else tail_x).shape[0], labels.numel(), device=self.kind.device)
        if in_head.any():
            rows = self.row[labels[in_head]]
            bias = None if self.head_bias is None else self.head_bias[rows]
            out[:, in_head] = F.linear(head_x, self.head_weight[rows], bias)
        if not in_head.all():
            supports, tail_weights = self.tail_slots(labels[~in_head])
            bias = 0 if self.tail_bias is None else self.tail_bias[labels[~in_head]]
            out[:, ~in_head] = torch.einsum("nmf,mf->nm", tail_x[:, supports], tail_weights) + bias
        return out

    @torch.no_grad()
    def initialize(self, layer: HasteOutputLayer, start: "priors.StartingWeights") -> None:
        """Each label's starting weights (a head row, or a dense tail vector taken on its support) and bias."""
        if self.head_weight is not None:
            self.head_weight.copy_(start.weights[self.head_labels])
            if self.head_bias is not None:
                self.head_bias.copy_(start.bias[self.head_labels])
        if self.filled_labels.numel() or self.group_labels.numel():
            on_support = start.on_supports(self.tail_slots(torch.arange(self.count, device=self.kind.device))[0])
            if self.filled_labels.numel():
                self.filled_weight.copy_(on_support[self.filled_labels])
            flat = self.group_labels.flatten()
            weights = self.group_weight.view(-1, self.group_weight.shape[-1])
            weights[flat >= 0] = on_support[flat[flat >= 0]]
            if start.bias is not None:
                self.tail_bias.copy_(start.bias)

    @torch.no_grad()
    def add_offsets(self, offsets: torch.Tensor) -> None:
        """Adds `offsets` `[count]` to the new labels' biases."""
        offsets = offsets.to(self.kind.device, torch.float32)
        if self.head_bias is not None:
            self.head_bias += offsets[self.head_labels]
        if self.tail_bias is not None:
            self.tail_bias += torch.where(self.kind == 0, 0.0, offsets)


# ------------------------------------------------------------------------------------------------ the extended layer


@torch.no_grad()
def extended_output_layer(layer: HasteOutputLayer, weights: NewLabelWeights) -> HasteOutputLayer:
    """A copy of `layer` with the new labels (ids `label_count + i`) where `weights` places them; every existing
    weight, support and group order kept."""
    count, old_count, group_size = weights.count, layer.label_count, layer.group_size
    head_added = weights.head_labels.numel()
    tail_module = layer.tail
    new = HasteOutputLayer(
        layer.in_features,
        old_count + count,
        layer.head_label_count + head_added,
        group_size,
        layer.fan_in,
        head_projection_dim=layer.head_projection.out_features if layer.head_projection is not None else None,
        tail_projection_dim=layer.tail_projection.out_features if layer.tail_projection is not None else None,
        tail_bias=tail_module is not None and (tail_module.bias is not None or weights.tail_bias is not None),
        loss=layer.loss_name,
        loss_reduction=layer.loss_reduction,
        supports_seed=layer.supports_seed,
        initialize=False,
    ).to(layer.output_labels.device)
    for name in ("head_projection", "head", "tail_projection", "tail"):
        if getattr(new, name) is not None:  # each module in its old dtype (an output layer may train in bf16)
            getattr(new, name).to(getattr(layer, name).weight.dtype)
    for name in ("head_projection", "tail_projection"):
        if getattr(layer, name) is not None:
            getattr(new, name).load_state_dict(getattr(layer, name).state_dict())
    new_ids = torch.arange(old_count, old_count + count, device=layer.output_labels.device)
    head_ids = layer.output_labels[: layer.head_label_count]
    if new.head is not None:
        new.head.weight.copy_(
            torch.cat([layer.head.weight, weights.head_weight.to(layer.head.weight.dtype)])
            if head_added
            else layer.head.weight
        )
        if new.head.bias is not None:
            added = [weights.head_bias.to(layer.head.bias.dtype)] if head_added else []
            new.head.bias.copy_(torch.cat([layer.head.bias, *added]))
        head_ids = torch.cat([head_ids, new_ids[weights.head_labels.to(new_ids.device)]])
    tail_ids = layer.output_labels[layer.head_label_count :]
    if new.tail is not None:
        dtype = tail_module.weight.dtype
        old_groups = tail_module.weight.shape[0]
        old_weight = tail_module.weight.clone()
        tail_ids = tail_ids.clone()
        if weights.filled_labels.numel():
            free = torch.nonzero(tail_ids < 0).squeeze(1)[: weights.filled_labels.numel()]
            old_weight.view(-1, layer.fan_in)[free] = weights.filled_weight.to(dtype)
            tail_ids[free] = new_ids[weights.filled_labels.to(new_ids.device)]
        flat = weights.group_labels.flatten().to(new_ids.device)
        group_ids = torch.where(flat >= 0, new_ids[flat.clamp(min=0)], -1)
        new.tail.weight.copy_(torch.cat([old_weight, weights.group_weight.to(dtype)]))
        new.tail.supports.copy_(
            torch.cat([tail_module.supports, weights.group_supports.to(tail_module.supports.dtype)])
        )
        if new.tail.bias is not None:
            bias = (
                tail_module.bias.clone()
                if tail_module.bias is not None
                else new.tail.bias.new_zeros(old_weight.shape[0] * group_size)
            )
            if weights.filled_labels.numel():
                bias[free] = weights.tail_bias[weights.filled_labels].to(dtype)
            group_bias = torch.where(flat >= 0, weights.tail_bias[flat.clamp(min=0)], 0).to(dtype)
            new.tail.bias.copy_(torch.cat([bias, group_bias]))
        assert new.tail.weight.shape[0] == old_groups + weights.group_labels.shape[0]
        tail_ids = torch.cat([tail_ids, group_ids])
    new.output_labels.copy_(torch.cat([head_ids, tail_ids]))
    new.check_invariants(source="the output layer with the new labels")
    return new


# ------------------------------------------------------------------------------------------------ the entry point


def add_labels(
    model,
    texts: list[str],
    examples=None,
    negatives: list[str] | None = None,
    names: list[str] | None = None,
    head: bool | None = None,
    tokenizer=None,
    *,
    fit_steps: int = DEFAULT_FIT_STEPS,
    learning_rate: float = DEFAULT_FIT_LEARNING_RATE,
    seed: int = 0,
    batch_size: int = DEFAULT_EVAL_BATCH_SIZE,
    max_length: int | None = None,
) -> list[int]:
    """`HasteForExtremeClassification.add_labels`: see its docstring. Returns the ids of the new labels.

    `fit_steps` Adam steps of `learning_rate` fit the new weights (with `negatives`); `seed` draws the new groups;
    texts are embedded `batch_size` at a time, cut at `max_length` tokens (default: the tokenizer's
    `model_max_length`, which `haste-hf train` sets to the training length, else `DEFAULT_MAX_LENGTH`)."""
    layer = model.output_layer
    if type(layer) is not HasteOutputLayer:
        raise ValueError(
            f"`model`: its output layer is a {type(layer).__name__} (one rank's share of a sharded layer): add labels "
            "to the saved model, loaded in one process with `from_pretrained`."
        )
    texts = _check_texts(texts, "texts")
    names = check_new_names(model, texts, names)
    examples = check_examples(examples, texts, names, model.config.label_count)
    if negatives is not None:
        negatives = _check_texts(negatives, "negatives")
    elif any(examples):
        raise ValueError(
            "`negatives`: fitting the new labels on `examples` needs negative texts too (a sample of the training "
            "texts tagged with none of the new labels)."
        )
    if head is not None and not isinstance(head, bool):  # "no" is truthy: it would put the labels in the head
        raise ValueError(f"`head` must be True, False or None (the default placement), got {head!r}.")
    if head is None:
        head = default_placement_is_head(layer)
    if head and layer.head is None:
        raise ValueError("`head`: this model has no dense head (head_label_count 0): add the labels to the tail.")
    if not head and layer.tail is None:
        raise ValueError(
            "`head`: this model has no tail (every label in the dense head): add the labels with head=True."
        )
    checked = [("fit_steps", fit_steps), ("batch_size", batch_size)]
    for name, value in checked + ([("max_length", max_length)] if max_length is not None else []):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "fit_steps" else 1):
            raise ValueError(
                f"`{name}` must be a {'non-negative' if name == 'fit_steps' else 'positive'} integer, got {value!r}."
            )
    if not (isinstance(learning_rate, (int, float)) and math.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"`learning_rate` must be a positive number, got {learning_rate!r}.")
    tokenizer = resolve_tokenizer(model, tokenizer)
    if max_length is None:  # a tokenizer without a length of its own says so with a huge number
        max_length = tokenizer.model_max_length if tokenizer.model_max_length <= 1 << 20 else DEFAULT_MAX_LENGTH

    count = len(texts)
    example_texts = [text for values in examples for text in values]
    old_names = model.label_names
    map_ids = priors.map_labels(layer.label_count, seed) if old_names is not None else torch.empty(0, dtype=torch.int64)
    embedded = embed_texts(
        model,
        tokenizer,
        texts + example_texts + (negatives or []) + [old_names[label] for label in map_ids.tolist()],
        batch_size=batch_size,
        max_length=max_length,
    )
    branches = [
        branch for branch, present in (("head", layer.head is not None), ("tail", layer.tail is not None)) if present
    ]
    features = {branch: branch_features(layer, embedded, branch) for branch in branches}
    # Positive pairs: each label's own text, then its examples.
    example_labels = torch.tensor([label for label, values in enumerate(examples) for _ in values], dtype=torch.int64)
    rows = torch.cat([torch.arange(count), count + torch.arange(example_labels.numel())]).to(embedded.device)
    labels = torch.cat([torch.arange(count), example_labels]).to(embedded.device)
    first_negative = count + example_labels.numel()
    negative_rows = torch.arange(first_negative, first_negative + len(negatives or []), device=embedded.device)
    label_rows = torch.arange(first_negative + negative_rows.numel(), embedded.shape[0], device=embedded.device)

    branch = "head" if head else "tail"
    # A fit pushes its own negatives down: its level, calibrated on them, would say its false positives are rarer
    # than they are on texts it never saw (deps, seed 0: a fitted head label lost 0.38 P@1 to the old labels).
    # Fitted, every other negative is the fit's and the rest calibrate (all of them do both where there is one).
    fitting = negatives is not None and fit_steps > 0
    split = fitting and negative_rows.numel() >= 2
    fit_negatives = negative_rows[1::2] if split else negative_rows
    reference = priors.reference_rows(negative_rows[::2] if split else negative_rows, label_rows, map_ids, seed)
    reference_tail = None if reference is None or head else features["tail"][reference[0]]
    # The copy of a text's own features scores real texts on a level no label name shows: only with negatives.
    blends = ((priors.HEAD_BLEND,) if head else priors.BLENDS) if negatives is not None else (0.0,)
    # One step, seconds to minutes with the trained label count: a bar shows that it runs and how long it took.
    with tqdm(total=1, desc="Mapping label texts to weights", disable=not is_progress_bar_enabled()) as bar:
        start = priors.mapped_weights(
            layer, branch, embedded[:count], embedded[label_rows], map_ids.to(embedded.device), reference_tail, blends
        )
        bar.update()
    if start is None:  # no label names to learn the map from: the texts' own directions
        start = fallback_start(layer, branch, features[branch], (rows, labels), negative_rows, count)
    placement = place_new_labels(layer, count, None if head else start.weights, seed)
    weights = NewLabelWeights(layer, placement, count)
    weights.initialize(layer, start)
    head_x, tail_x = features.get("head"), features.get("tail")
    if fitting:
        negative_x = tuple(None if x is None else x[fit_negatives] for x in (head_x, tail_x))
        with torch.enable_grad():
            generator_state = torch.random.get_rng_state()
            try:
                torch.manual_seed(seed)
                fit_new_labels(
                    weights, (head_x, tail_x), (rows, labels), negative_x, steps=fit_steps, learning_rate=learning_rate
                )
            finally:
                torch.random.set_rng_state(generator_state)
    examples_only = rows >= count  # a label's own text is no training text: it would say the label is surer
    calibrate_new_labels(
        layer,
        weights,
        embedded,
        features,
        reference,
        (rows[examples_only], labels[examples_only]) if negatives is not None else None,
    )
    all_names = None if names is None else existing_label_names(model) + names
    new_layer = extended_output_layer(layer, weights)
    model.output_layer = new_layer
    old_count = model.config.label_count
    model.config.label_count = old_count + count
    model.config.head_label_count = new_layer.head_label_count
    model.config.tail_bias = new_layer.tail is not None and new_layer.tail.bias is not None
    model.set_label_names(all_names)
    return list(range(old_count, old_count + count))


__all__ = [
    "NewLabelPlacement",
    "NewLabelWeights",
    "add_labels",
    "default_placement_is_head",
    "embed_texts",
    "place_new_labels",
]
