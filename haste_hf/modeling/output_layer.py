# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""HASTE's output layer on any features `[B, d]`: a dense head over the most frequent labels and a
group-shared fixed fan-in sparse tail over the rest.

features h -> P_head h -> dense head logits           output positions [0, n_head)
           -> P_tail h -> group-sparse tail logits     positions n_head + k * G + g

`output_labels` maps output positions to label ids (-1 at the padding slots that trail the last group).
Training works in position space: positive label ids are mapped to positions, and the loss consumes each
branch's logits where they are computed (`losses.output_layer_loss`: the fused op on CUDA, label chunks
elsewhere), so no `[B, L]` logits exist; top-k and logits in label order are produced for prediction only.

A layer scores the head rows `head_rows` and the tail groups `tail_groups` it holds: all of them here, one
rank's share in `haste_hf.training.sharded_output_layer.ShardedOutputLayer`, which reuses the loss and top-k below.

Flat and Hub-exportable: imports only torch and its exportable siblings, so a checkpoint folder carries it
with the modeling file (`trust_remote_code=True` loading without `haste_hf`).
"""

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import skip_init
from transformers.utils import ModelOutput

from . import label_positions
from .checks import _check_ranked_scores, check_features, check_layer_arguments, check_output_layer_invariants
from .configuration_haste import (
    DEFAULT_FAN_IN,
    DEFAULT_GROUP_SIZE,
    DEFAULT_HEAD_LABEL_FRACTION,
    LOSS_REDUCTIONS,
    check_one_of,
    head_label_count_for,
)
from .label_positions import (
    check_layout,
    default_output_labels,
    dense_labels,
    label_positions_of,
    output_label_range,
    output_labels_from_frequencies,
    output_labels_of_head_ids,
    positive_positions,
)
from .losses import LOSSES, output_layer_loss, targets_of_chunk
from .rewiring import RewiringResult, check_rewiring_options, rewire_
from .sparse_ops import GroupSparseLinear, chunks, group_sparse_topk, merge_topk, random_supports


# Bounds the `[B, chunk]` block of logits scored at once by top-k off the fused kernels (head, CPU).
TOPK_CHUNK_ELEMENTS = 1 << 24
# Head rows per matmul of the position logits, the last block padded with zeros: a matmul's sums depend on its shape,
HEAD_LOGIT_ROWS = 512  # and rows added to the head (`add_labels(head=True)`) leave the existing logits bit-identical.

# Expected norm of a row of n weights drawn U(-1/sqrt(n), 1/sqrt(n)): PyTorch's default for the head, the paper's
# for the tail (n = F), whatever n is.
INITIAL_ROW_NORM = 1 / math.sqrt(3)


@dataclass
class OutputLayerOutput(ModelOutput):
    """
    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*): the loss over all labels, when labels are given.
        logits (`torch.FloatTensor` of shape `(batch_size, label_count)`, *optional*): scores in label-id order.
        top_label_ids (`torch.LongTensor` of shape `(batch_size, top_k)`, *optional*): the best label ids.
        top_scores (`torch.FloatTensor` of shape `(batch_size, top_k)`, *optional*): their logits.
    """

    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    top_label_ids: torch.LongTensor | None = None
    top_scores: torch.FloatTensor | None = None


@dataclass
class TopKOutput(ModelOutput):
    """
    Args:
        label_ids (`torch.LongTensor` of shape `(batch_size, k)`): the k best label ids, best first.
        scores (`torch.FloatTensor` of shape `(batch_size, k)`): their logits.
    """

    label_ids: torch.LongTensor | None = None
    scores: torch.FloatTensor | None = None


class HasteOutputLayer(nn.Module):
    """HASTE's output layer on features `[B, in_features]`: the dense head, the group-sparse tail, their
    optional projections and the label-position map.

    Args:
        in_features: width d of the features.
        label_count: number of labels L (may be left out with a `LabelLayout`).
        head_labels: the dense head: a number of labels (labels are then taken to be ordered by decreasing
            frequency, the first ones in the head), the head's label ids (the tail takes the others in id
            order), or a `haste_hf.LabelLayout` (head ids, tail order and G). Default: the paper's share,
            `DEFAULT_HEAD_LABEL_FRACTION` (3%) of the labels.
        group_size: labels per tail group G (default `DEFAULT_GROUP_SIZE`, or the layout's).
        fan_in: features F each tail group reads.
        head_projection_dim / tail_projection_dim: width of a branch's linear projection of the features;
            None feeds the features directly.
        tail_bias: whether tail labels have a bias.
        loss / loss_reduction: a name of `losses.LOSSES`; `"sum"` over labels (averaged over the batch) or
            `"mean"` over labels too.
        supports_seed: seed of the initial random supports.
        rows_device / rows_dtype: where and in what dtype the head and tail are built: None (the CPU; fp32), or "meta"
            for a sharded run's rows that each rank builds its share of (`haste_hf.modeling.initialization`).

    `layer(features, labels)` gives the loss (labels as ids padded with -100, or a dense multi-hot),
    `layer.topk(features, k)` the best labels, `layer.logits(features)` the `[B, L]` logits (small L).

    Refused with a `ValueError`: features that are not `[B, in_features]` (shapes only, no device sync), the loss
    of an empty batch (its top-k and logits are empty), tail supports outside the features (checked once after
    each change of the buffer: one sync on accelerators), and NaN scores to rank (`topk` would put them first;
    checked on the CPU, and on accelerators with `HASTE_HF_VALIDATE=1`, where it costs a sync per batch).
    """

    # One rank's share of a sharded layer says so (see `ShardedOutputLayer`): it cannot save itself alone.
    is_share = False

    def __init__(
        self,
        in_features: int,
        label_count: int | None = None,
        head_labels=None,
        group_size: int | None = None,
        fan_in: int = DEFAULT_FAN_IN,
        *,
        head_projection_dim: int | None = None,
        tail_projection_dim: int | None = None,
        tail_bias: bool = False,
        loss: str = "bce",
        loss_reduction: str = "sum",
        supports_seed: int = 0,
        initialize: bool = True,
        rows_device=None,
        rows_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        output_labels = None
        if hasattr(head_labels, "tail_order"):  # a LabelLayout
            label_count, head_label_count = check_layout(head_labels, label_count, group_size)
            group_size = head_labels.group_size
            output_labels = head_labels
        elif label_count is None:
            raise ValueError("Give `label_count` (the number of labels), or a LabelLayout as `head_labels`.")
        elif head_labels is None:
            head_label_count = head_label_count_for(DEFAULT_HEAD_LABEL_FRACTION, label_count)
        elif isinstance(head_labels, numbers.Integral) and not isinstance(head_labels, bool):
            head_label_count = int(head_labels)
        else:  # head label ids: the tail takes the others in id order
            output_labels = output_labels_of_head_ids(head_labels, label_count)
            head_label_count = torch.as_tensor(head_labels).numel()
        group_size = DEFAULT_GROUP_SIZE if group_size is None else group_size
        check_layer_arguments(
            in_features, label_count, head_label_count, group_size, fan_in, head_projection_dim, tail_projection_dim
        )
        check_one_of("loss", loss, tuple(LOSSES))
        check_one_of("loss_reduction", loss_reduction, LOSS_REDUCTIONS)

        self.in_features, self.label_count, self.head_label_count = in_features, label_count, head_label_count
        self.group_size, self.fan_in, self.supports_seed = group_size, fan_in, supports_seed
        self.loss_name, self.loss_reduction = loss, loss_reduction
        self.tail_group_count = -(-(label_count - head_label_count) // group_size)
        # What this layer scores: every head row and tail group (a `ShardedOutputLayer` holds a share).
        self.head_rows, self.tail_groups = (0, head_label_count), (0, self.tail_group_count)
        self.head_projection = self.head = self.tail_projection = self.tail = None
        if head_label_count:
            if head_projection_dim:
                self.head_projection = nn.Linear(in_features, head_projection_dim)
            # Not initialised here (no draw from torch's generator): where the rows are changes no other weight.
            rows = dict(device=rows_device or torch.get_default_device(), dtype=rows_dtype)
            self.head = skip_init(nn.Linear, head_projection_dim or in_features, head_label_count, **rows)
        if head_label_count < label_count:
            if tail_projection_dim:
                self.tail_projection = nn.Linear(in_features, tail_projection_dim)
            tail_width = tail_projection_dim or in_features
            self.tail = GroupSparseLinear(
                tail_width, self.tail_group_count, group_size, fan_in, tail_bias, rows_device, rows_dtype
            )
        padded = head_label_count + self.tail_group_count * group_size
        self.register_buffer("output_labels", torch.empty(padded, dtype=torch.int64, device=rows_device))
        self._label_positions_cache = self._checked_supports = self.output_label_source = None
        if initialize:  # a `HasteForExtremeClassification` initialises its layer itself, the transformers way
            self.reset_parameters()
        if output_labels is not None:
            self.set_output_labels_(output_labels)

    @classmethod
    def from_config(cls, config, **kwargs) -> "HasteOutputLayer":
        """The output layer a `HasteConfig` describes, on its encoder's pooled output."""
        return cls(
            config.encoder.hidden_size,
            config.label_count,
            config.head_label_count,
            config.group_size,
            config.fan_in,
            head_projection_dim=config.head_projection_dim,
            tail_projection_dim=config.tail_projection_dim,
            tail_bias=config.tail_bias,
            loss=config.loss,
            loss_reduction=config.loss_reduction,
            supports_seed=config.supports_seed,
            **kwargs,
        )

    @property
    def tail_label_count(self) -> int:
        return self.label_count - self.head_label_count

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Fresh weights (PyTorch's default for the dense layers, U(-1/sqrt(F), 1/sqrt(F)) for the tail), random
        supports from `supports_seed` and positions in label-id order."""
        for module in (self.head_projection, self.head, self.tail_projection):
            if module is not None:
                module.reset_parameters()
        if self.tail is not None:
            bound, supports = self.tail.initial_weights(self.supports_seed)
            self.tail.weight.uniform_(-bound, bound)
            if self.tail.bias is not None:
                self.tail.bias.zero_()
            self.tail.supports.copy_(supports)
        self.set_output_labels_(None)

    @torch.no_grad()
    def set_output_labels_(self, source) -> None:
        """`output_labels` from `source`: a `LabelLayout`, the ids by position, or None (label-id order). Where the
        buffer is on the meta device with the rows (`deferred_output_rows`), `source` is kept instead: each rank's
        share takes its own positions from it (`ShardedOutputLayer.shard`), and no rank builds the `[L]` whole."""
        if self.output_labels.device.type == "meta":
            self.output_label_source = source
        else:
            self.output_labels.copy_(output_label_range(source, self.label_count, 0, self.output_labels.numel()))

    @torch.no_grad()
    def init_from_label_embeddings_(
        self, label_ids, embeddings: torch.Tensor, scale: float = 1.0, center: torch.Tensor | None = None
    ) -> None:
        """Sets the weights of the labels `label_ids` `[n]` from embeddings of their texts `[n, in_features]` (the
        features the encoder gives each text, before the projections; see `labels.embeddings.label_text_embeddings`).

        A head label's row is the head's input for its embedding less the head's input for `center` (`P_head (e -
        c)`, or `e - c` without a projection); a tail label's weights are the same through the tail's projection,
        read on its group's support (`(P_tail (e - c))[I_g]`). With `center` the mean embedding of label texts, a
        label starts by scoring a text by how much closer the text lies to its own text than to label texts in
        general (what all texts share says nothing of a label, and would score every label high on every text).
        Each row is scaled to `scale` times `INITIAL_ROW_NORM`, the expected norm of a default row, so the output
        learning rate that suits the default initialisation suits these rows too. Biases, supports and the other
        labels are left as they are.
        """
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < math.inf:
            raise ValueError(f"`scale` (of the rows' norm) must be a positive number, got {scale!r}.")
        device = self.output_labels.device
        ids = torch.as_tensor(label_ids, dtype=torch.int64, device=device)
        if ids.dim() != 1 or tuple(embeddings.shape) != (ids.numel(), self.in_features):
            raise ValueError(
                f"Give one embedding of {self.in_features} features per label id: got {tuple(ids.shape)} ids and "
                f"embeddings of shape {tuple(embeddings.shape)}."
            )
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.label_count):
            raise ValueError(f"`label_ids` holds ids outside [0, {self.label_count}): give label ids of this layer.")
        if ids.unique().numel() != ids.numel():
            raise ValueError("`label_ids` lists a label twice: give each label once.")
        if center is not None and tuple(center.shape) != (self.in_features,):
            raise ValueError(
                f"`center` must be one embedding of {self.in_features} features, got {tuple(center.shape)}."
            )
        projection = self.head_projection or self.tail_projection
        dtype = projection.weight.dtype if projection is not None else torch.float32
        # Not cast to the rows' dtype: bf16 rows start from the fp32 rows rounded, not from rounded embeddings.
        head_x, tail_x = self.branch_inputs(embeddings.to(device, dtype), cast=False)
        if center is not None:  # through the projections, so that their biases cancel
            head_c, tail_c = self.branch_inputs(center.to(device, dtype).unsqueeze(0), cast=False)
            head_x = None if head_x is None else head_x.float() - head_c.float()
            tail_x = None if tail_x is None else tail_x.float() - tail_c.float()
        norm = scale * INITIAL_ROW_NORM
        positions = self._positions_of_ids(ids)  # one rank's share (`is_share`) sets the rows it holds alone
        if bool((positions < 0).any()):
            raise ValueError("`label_ids` holds labels this share of the layer does not hold: give it its own labels.")
        in_head = positions < self.head_label_count
        if bool(in_head.any()):
            rows = F.normalize(head_x[in_head].float(), dim=1) * norm
            self.head.weight[positions[in_head] - self.head_rows[0]] = rows.to(self.head.weight.dtype)
        if not bool(in_head.all()):
            slots = positions[~in_head] - self.head_label_count
            groups, members = slots // self.group_size - self.tail_groups[0], slots % self.group_size
            values = tail_x[~in_head].float().gather(1, self.tail.supports[groups].long())
            self.tail.weight[groups, members] = (F.normalize(values, dim=1) * norm).to(self.tail.weight.dtype)

    # ------------------------------------------------------------------------------------- labels

    @property
    def label_positions(self) -> torch.Tensor:
        """Inverse of `output_labels`: the output position of each label id `[L]` (derived, cached)."""
        if torch.compiler.is_compiling():
            # A traced graph (torch.compile, torch.export) has no data pointer to key the cache on: it derives the
            # map from the buffer itself, in ops whose shapes do not depend on the data.
            return label_positions_of(self.output_labels, self.label_count)
        key = (self.output_labels.data_ptr(), self.output_labels._version, self.output_labels.device)
        if self._label_positions_cache is None or self._label_positions_cache[0] != key:
            self._label_positions_cache = (key, label_positions_of(self.output_labels, self.label_count))
        return self._label_positions_cache[1]

    def _positions_of_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Label ids -> their output positions (of a share: -1 where another rank holds them)."""
        return self.label_positions[ids]

    def positive_positions(self, labels: torch.Tensor) -> torch.Tensor:
        """Padded positive label ids `[B, P]` -> their output positions, -1 for padding (repeats kept: every
        loss path counts a position once)."""
        return positive_positions(labels, self.label_positions, self.label_count)

    def dense_labels(self, labels: torch.Tensor, batch_size: int) -> torch.Tensor | None:
        """`labels` as a dense multi-hot, or None for padded ids (`label_positions.dense_labels`)."""
        return dense_labels(labels, batch_size, self.label_count)

    def check_k(self, k: int) -> None:
        if not 1 <= k <= self.label_count:
            raise ValueError(f"`k` must lie in [1, label_count={self.label_count}], got {k}.")

    # ------------------------------------------------------------------------------------- scoring

    def check_features(self, features) -> None:
        """Raises a `ValueError` unless `features` is `[batch, in_features]` (shapes only: no device sync)."""
        check_features(features, self.in_features)

    def _check_supports(self) -> None:
        """Raises a `ValueError` when the tail's supports index outside the features (the kernels would read there): at
        each use on a CPU or with `HASTE_HF_VALIDATE=1` (edits through `.data` keep the version), else once a version."""
        if self.tail is None or torch.compiler.is_compiling() or getattr(torch.compiler, "is_exporting", bool)():
            return
        supports = self.tail.supports
        key = (id(supports), 0 if supports.is_inference() else supports._version, supports.device)
        if key == self._checked_supports and supports.device.type != "cpu" and not label_positions.VALIDATE_LABELS:
            return
        if supports.numel() and (int(supports.min()) < 0 or int(supports.max()) >= self.tail.in_features):
            raise ValueError(
                f"`tail.supports` holds feature indices in [{int(supports.min())}, {int(supports.max())}], outside "
                f"[0, {self.tail.in_features}): each must index a feature of the tail's input."
            )
        self._checked_supports = key

    def branch_inputs(self, features: torch.Tensor, cast: bool = True):
        """Inputs of the head and the tail, each projected if configured and cast to its branch's dtype (the output
        layer may train in bf16 under an fp32 encoder; `cast=False`: not); None for an absent branch."""
        self.check_features(features)
        self._check_supports()
        head_x = tail_x = None
        if self.head is not None:
            head_x = self.head_projection(features) if self.head_projection is not None else features
            head_x = head_x.to(self.head.weight.dtype) if cast else head_x
        if self.tail is not None:
            tail_x = self.tail_projection(features) if self.tail_projection is not None else features
            tail_x = tail_x.to(self.tail.weight.dtype) if cast else tail_x
        return head_x, tail_x

    def position_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over output positions `[B, head_label_count + K * G]` (padding slots included)."""
        return self._position_logits(*self.branch_inputs(features))

    def _position_logits(self, head_x, tail_x) -> torch.Tensor:
        parts = [self._head_logits(head_x)] if self.head is not None else []
        parts += [self.tail(tail_x)] if self.tail is not None else []
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def _head_logits(self, head_x) -> torch.Tensor:
        """The head's logits `[B, H]`, `HEAD_LOGIT_ROWS` rows per matmul of one shape whatever H is."""
        weight, bias, rows = self.head.weight, self.head.bias, self.head.weight.shape[0]
        logits = []
        for start in range(0, rows, HEAD_LOGIT_ROWS):
            block, padding = slice(start, start + HEAD_LOGIT_ROWS), max(0, start + HEAD_LOGIT_ROWS - rows)
            block_bias = None if bias is None else F.pad(bias[block], (0, padding))
            logits.append(F.linear(head_x, F.pad(weight[block], (0, 0, 0, padding)), block_bias)[:, : rows - start])
        return torch.cat(logits, dim=1)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """`[B, label_count]` logits in label-id order: for small L, or the few who need every score."""
        return self.position_logits(features)[:, self.label_positions]

    def _loss_scale(self, batch_size: int) -> float:
        return 1.0 / (batch_size * (self.label_count if self.loss_reduction == "mean" else 1))

    @property
    def tail_first_position(self) -> int:
        """Output position of this layer's first tail slot."""
        return self.head_label_count + self.tail_groups[0] * self.group_size

    @property
    def tail_valid_count(self) -> int:
        """This layer's tail columns that are labels: all but the padding slots, which trail the last group."""
        return max(
            0,
            min(self.head_label_count + self.tail_groups[1] * self.group_size, self.label_count)
            - self.tail_first_position,
        )

    def scored_loss(self, head_x, tail_x, positions: torch.Tensor, scale: float) -> torch.Tensor:
        """`scale` times the loss of this layer's labels from the branch inputs and the positive positions
        `[B, P]`, each branch's logits consumed where they are computed (`losses.output_layer_loss`): no
        `[B, L]` logits in fp32, no concatenation of head and tail. Positions are shifted to each branch's
        first column; those outside it (padding, other branches, other ranks' shares) are ignored."""
        losses = []
        if self.head is not None:
            head_width = self.head_rows[1] - self.head_rows[0]
            head = self.head
            losses.append(
                output_layer_loss(
                    head_x, head.weight, head.bias, positions - self.head_rows[0], head_width, scale, self.loss_name
                )
            )
        if self.tail is not None:
            losses.append(
                output_layer_loss(
                    tail_x,
                    self.tail.weight,
                    self.tail.bias,
                    positions - self.tail_first_position,
                    self.tail_valid_count,
                    scale,
                    self.loss_name,
                    supports=self.tail.supports,
                )
            )
        return losses[0] if len(losses) == 1 else losses[0] + losses[1]

    def reference_loss(self, position_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss from materialised position logits, with labels as padded ids or a dense multi-hot: the
        unfused reference, and the path of dense multi-hot labels (soft targets included)."""
        valid_logits = position_logits[:, : self.label_count].float()  # padding slots trail the last group
        dense = self.dense_labels(labels, position_logits.shape[0])
        if dense is not None:
            targets = dense[:, self.output_labels[: self.label_count]].to(valid_logits.dtype)
        else:
            targets = targets_of_chunk(
                self.positive_positions(labels), 0, self.label_count, self.label_count, valid_logits.dtype
            )
        terms, _ = LOSSES[self.loss_name](valid_logits, targets)
        return terms.sum() * self._loss_scale(position_logits.shape[0])

    def scored_topk(self, head_x, tail_x, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `k` best (fp32 scores, output positions) among this layer's labels, from the branch inputs and
        without their logits: the head in chunks of rows, the tail in the forward kernel
        (`sparse_ops.group_sparse_topk`); padding slots never win."""
        reference = head_x if head_x is not None else tail_x
        batch_size = reference.shape[0]
        best = (
            reference.new_empty(batch_size, 0, dtype=torch.float32),
            reference.new_empty(batch_size, 0, dtype=torch.int64),
        )
        if self.head is not None:
            for chunk in chunks(self.head.weight.shape[0], batch_size, TOPK_CHUNK_ELEMENTS):
                bias = None if self.head.bias is None else self.head.bias[chunk]
                scores, top = (
                    F.linear(head_x, self.head.weight[chunk], bias)
                    .float()
                    .topk(min(k, chunk.stop - chunk.start), dim=1)
                )
                best = merge_topk(best, (scores, top + self.head_rows[0] + chunk.start), k)
        if self.tail is not None:
            scores, columns = group_sparse_topk(
                tail_x,
                self.tail.weight,
                self.tail.supports,
                self.tail.bias,
                k,
                self.tail_valid_count,
                chunk_elements=TOPK_CHUNK_ELEMENTS,
            )
            best = merge_topk(best, (scores, columns.clamp(min=0) + self.tail_first_position), k)
        return best

    def _top_of_positions(self, position_logits: torch.Tensor, k: int):
        """The `k` best (scores, positions) of materialised position logits; padding slots never win."""
        padding = torch.arange(position_logits.shape[1], device=position_logits.device) >= self.label_count
        return position_logits.float().masked_fill(padding, float("-inf")).topk(k, dim=1)

    # ------------------------------------------------------------------------------------- the face

    def forward(
        self,
        features: torch.Tensor,
        labels: torch.Tensor | None = None,
        top_k: int | None = None,
        return_logits: bool | None = None,
    ) -> OutputLayerOutput:
        """The loss (when `labels` are given: ids `[B, P]` padded with -100, or a dense multi-hot
        `[B, label_count]`), the `top_k` best labels, and the `[B, label_count]` logits (by default only
        when no labels are given)."""
        if return_logits is None:
            return_logits = labels is None
        if top_k is not None:
            self.check_k(top_k)
        head_x, tail_x = self.branch_inputs(features)
        if labels is not None and features.shape[0] == 0:
            raise ValueError("`features` holds no example: an empty batch has no loss (its mean over examples is 0/0).")
        dense = labels is not None and self.dense_labels(labels, features.shape[0]) is not None
        # Logits over all positions only when they are returned, or for a dense multi-hot's loss.
        position_logits = self._position_logits(head_x, tail_x) if return_logits or dense else None
        loss = None
        if labels is not None:
            if dense:
                loss = self.reference_loss(position_logits, labels)
            else:
                loss = self.scored_loss(
                    head_x, tail_x, self.positive_positions(labels), self._loss_scale(features.shape[0])
                )
        top_scores = top_label_ids = None
        if top_k is not None:
            with torch.no_grad():
                if position_logits is not None:
                    top_scores, top_positions = self._top_of_positions(position_logits, top_k)
                else:
                    top_scores, top_positions = self.scored_topk(head_x, tail_x, top_k)
                _check_ranked_scores(top_scores)
            top_label_ids = self.output_labels[top_positions]
        logits = position_logits[:, self.label_positions] if return_logits else None
        return OutputLayerOutput(loss=loss, logits=logits, top_label_ids=top_label_ids, top_scores=top_scores)

    def loss(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss (`loss`, `loss_reduction`) of `features` `[B, d]` against `labels`."""
        return self(features, labels=labels, return_logits=False).loss

    @torch.no_grad()
    def topk(self, features: torch.Tensor, k: int) -> TopKOutput:
        """The `k` best labels of each example, best first, in memory `O(B * (k + chunk))`, never `O(B * L)`."""
        self.check_k(k)
        scores, positions = self.scored_topk(*self.branch_inputs(features), k)
        _check_ranked_scores(scores)
        return TopKOutput(label_ids=self.output_labels[positions], scores=scores)

    # ------------------------------------------------------------------------------------- training upkeep

    def output_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters of the head and the tail (what the output layer's SGD trains); the
        projections train with the encoder."""
        return [
            param
            for module in (self.head, self.tail)
            if module is not None
            for param in module.parameters()
            if param.requires_grad
        ]

    def trained_modules(self) -> list[str]:
        """Names of this layer's modules that a new model must train in full (LoRA's `modules_to_save`)."""
        return [
            name for name in ("head", "tail", "head_projection", "tail_projection") if getattr(self, name) is not None
        ]

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clips the gradients of `output_parameters()` to a total norm of `max_norm`; returns that norm."""
        return torch.nn.utils.clip_grad_norm_(self.output_parameters(), max_norm)

    @torch.no_grad()
    def rewire_(
        self, fraction: float, scope: str, init: str, seed: int, step: int, score: str = "mean_abs"
    ) -> tuple[RewiringResult, int]:
        """`haste_hf.modeling.rewiring.rewire_` of the tail, padding slots kept out of the scores. Returns what changed
        and how many (group, slot) pairs were rewired in all."""
        check_rewiring_options(fraction, scope, init, zero_fraction_ok=True, score=score)
        tail = self.tail
        mask = (self.output_labels[self.tail_first_position :] >= 0).view(tail.weight.shape[:2])  # labels, not padding
        result = rewire_(tail.weight, tail.supports, tail.in_features, fraction, scope, init, seed, step, mask, score)
        return result, result.count

    # ------------------------------------------------------------------------------------- invariants

    def check_invariants(self, source="the output layer") -> None:
        """Raises a `ValueError` naming `source` unless the tail's supports are distinct features in range and
        `output_labels` places every label exactly once before the padding slots: a corrupt checkpoint would
        otherwise load and fail in an index error, or rank the wrong labels."""
        check_output_layer_invariants(self, source)

    def extra_repr(self) -> str:
        return (
            f"label_count={self.label_count}, head_label_count={self.head_label_count}, group_size={self.group_size}, "
            f"fan_in={self.fan_in}, loss={self.loss_name!r}, loss_reduction={self.loss_reduction!r}"
        )


__all__ = [
    "GroupSparseLinear",
    "HasteOutputLayer",
    "OutputLayerOutput",
    "TopKOutput",
    "check_layout",
    "default_output_labels",
    "output_labels_from_frequencies",
    "random_supports",
]
