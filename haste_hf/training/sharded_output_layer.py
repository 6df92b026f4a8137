# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Several GPUs: the output layer sharded by labels, the encoder data-parallel.

Plain data parallelism replicates the output layer and all-reduces its gradient every step, O(L * F)
bytes (1.1 GB of bf16 at 8.6M labels). Sharded, as the "partial FC" of large-scale face recognition:

- each rank holds a contiguous share of the dense head's rows and of the tail's groups
  (`assign_output_layer`), and the whole encoder under DDP, which leaves the shares alone;
- the branch inputs `[B_local, d]` (pooled, projected) and the positive label ids are all-gathered, so
  each rank scores its labels over the global batch with the loss and top-k it inherits from
  `HasteOutputLayer`: its part of the loss, its weight gradients, its share of every example's top-k
  (merged across ranks, never an `[N, L]` matrix);
- the feature gradient is reduce-scattered back to the rank of each example, scaled by the world size
  because DDP averages the encoder's gradients where the sharded loss is a sum over ranks.

Communication per step is O(B * d) instead of O(L * F). Rewiring gathers the tail's slot scores and
supports (every `rewiring_interval` steps) and runs the same pure function of (seed, step, weights) as
one process, so a sharded run equals the single-process run of the same global batch. Saving and loading
never gather the layer: each rank writes and reads its own rows (`haste_hf.training.shard_checkpoints`). The collectives are
`haste_hf.training.distributed`'s (NCCL on GPUs, gloo on CPUs).
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..modeling.defaults import LABEL_PADDING_ID
from ..modeling.initialization import initialize_output_rows_
from ..modeling.label_positions import output_label_range, positive_positions
from ..modeling.output_layer import HasteOutputLayer, OutputLayerOutput, TopKOutput
from ..modeling.output_shards import ROW_SHARDED_TENSORS
from ..modeling.rewiring import (
    RewiringResult,
    check_rewiring_options,
    check_supports,
    group_slot_scores,
    regrow_weakest_,
    reset_pruned_weights_,
)
from ..modeling.sparse_ops import chunks
from .distributed import (
    all_gather_rows,
    all_gather_sizes,
    balanced_ranges,
    communication_device,
    gather_rows_to_cpu,
    gather_rows_with_gradient,
)
from .shard_checkpoints import layer_prefix


# Label ids per block where a layer's are read or built in blocks: 512 KB of int64 (10^9 labels whole: 8 GB).
LABEL_BLOCK = 1 << 16
# The tensors whose row counts split a share's `output_labels`: its head rows, then its tail slots.
SPLIT_BY = ("head.weight", "tail.bias")


@dataclass(frozen=True)
class OutputLayerSlice:
    """The rows of the dense head `[start, stop)` and the groups of the sparse tail `[start, stop)` one
    rank holds."""

    head_rows: tuple[int, int]
    tail_groups: tuple[int, int]


def assign_output_layer(head_label_count: int, tail_group_count: int, world_size: int) -> list[OutputLayerSlice]:
    """The share of the output layer of each of `world_size` ranks: contiguous, balanced runs of head rows
    and of tail groups, rank order following label-position order (a pure function: every rank computes
    the same assignment, and a label plan can store it). With fewer head rows or tail groups than ranks, the last
    ranks hold an empty share of them."""
    heads, tails = balanced_ranges(head_label_count, world_size), balanced_ranges(tail_group_count, world_size)
    return [OutputLayerSlice(head, tail) for head, tail in zip(heads, tails)]


def resolve_shard_output_layer(option: bool | None, world_size: int) -> bool:
    """Whether to shard: `option`, or when it is None, whenever there is more than one rank."""
    return world_size > 1 if option is None else bool(option) and world_size > 1


def _multi_hot_to_ids(labels: torch.Tensor) -> torch.Tensor:
    """Bool `[B, L]` -> positive ids `[B, P]` padded with -100."""
    counts = labels.sum(1)
    width = int(counts.max()) if labels.shape[0] else 0
    ids = torch.full((labels.shape[0], width), LABEL_PADDING_ID, dtype=torch.int64, device=labels.device)
    rows, columns = torch.nonzero(labels, as_tuple=True)
    starts = torch.cumsum(counts, 0) - counts
    ids[rows, torch.arange(rows.numel(), device=labels.device) - starts[rows]] = columns
    return ids


def _rows_deferred(layer: HasteOutputLayer) -> bool:
    """Whether the layer's head and tail are on the meta device (`deferred_output_rows`), to be built by share."""
    return any(module is not None and module.weight.device.type == "meta" for module in (layer.head, layer.tail))


def _output_labels_into(layer: HasteOutputLayer, out: torch.Tensor, start: int) -> torch.Tensor:
    """`out` <- the label ids of the layer's positions `[start, start + len(out))`, a block of `LABEL_BLOCK` at a time:
    from its `output_label_source` where the buffer is on the meta device with the rows (`deferred_output_rows`), so
    that no rank builds the `[L]` whole, else from the buffer."""
    deferred = layer.output_labels.device.type == "meta"
    for rows in chunks(out.numel(), 1, LABEL_BLOCK):
        first, stop = start + rows.start, start + rows.stop
        block = (
            output_label_range(layer.output_label_source, layer.label_count, first, stop)
            if deferred
            else layer.output_labels[first:stop]
        )
        out[rows].copy_(block)
    return out


# The label order's term of the fingerprint is taken modulo this prime: exact in integers (a float64 sum of label x
# position, ~L^3 / 3, drops the difference a swap of two neighbouring labels makes from a few 10^5 labels on), and a
# swap of two labels, which changes the sum by (a - b) x (q - p), both below it, is never a multiple of it.
_ORDER_MODULUS = 2**31 - 1


def _fingerprint(layer: HasteOutputLayer) -> torch.Tensor:
    """A float64 vector that differs between ranks whose output layers (or label order) differ."""
    weighted, block = 0, torch.empty(min(LABEL_BLOCK, layer.output_labels.numel()), dtype=torch.int64)
    for rows in chunks(layer.output_labels.numel(), 1, LABEL_BLOCK):
        labels = _output_labels_into(layer, block[: rows.stop - rows.start], rows.start)
        positions = torch.arange(rows.start + 1, rows.stop + 1, dtype=torch.int64)
        # Each product (labels and positions below 2^31) fits an int64, each remainder 2^31, a block's sum 2^47.
        weighted = (weighted + int(labels.mul(positions).remainder_(_ORDER_MODULUS).sum())) % _ORDER_MODULUS
    values = [torch.tensor(float(weighted), dtype=torch.float64)]
    if _rows_deferred(layer):  # no values yet: the seeds they will be drawn from (float64 holds 2**53 exactly)
        seeds = (layer.initial_weight_seed % 2**53, layer.initial_weight_seed >> 53, layer.supports_seed)
        values.extend(torch.tensor(float(seed), dtype=torch.float64) for seed in seeds)
    for module in (layer.head, layer.tail):
        if module is not None and not _rows_deferred(layer):
            values.extend(t.detach().double().sum() for t in module.state_dict().values())
    return torch.stack([v.cpu() for v in values])


class ShardedOutputLayer(HasteOutputLayer):
    """This rank's share of a `HasteOutputLayer`: the head rows `head_rows` and tail groups `tail_groups`
    of `assign_output_layer`, scored over the global batch together with the other ranks.

    Built by `ShardedOutputLayer.shard(layer)` (or `shard_output_layer_(model)`). Every method that
    communicates is a collective: all ranks call it, with their own batches (of any size, also empty).
    """

    is_share = True
    # Tensors (by name in the layer) of which each rank holds some rows.
    SHARDED_TENSORS = ROW_SHARDED_TENSORS

    @classmethod
    def shard(
        cls, layer: HasteOutputLayer, group=None, initialize: bool = True, rows_device=None
    ) -> "ShardedOutputLayer":
        """Collective: every rank passes the same layer (same weights and label order, checked) and gets its
        share. The layer's modules are taken over, then cut to the share's rows; a layer whose head and tail are on the
        meta device (`haste_hf.modeling.initialization.deferred_output_rows`, seeds checked alike) gets them built,
        only the share's rows, equal to the same rows of the layer built whole, on `rows_device` (default: the CPU;
        a GPU where the rows are read from a folder next, so that no host process holds the share)."""
        deferred = _rows_deferred(layer)
        if deferred and getattr(layer, "initial_weight_seed", None) is None:
            raise ValueError(
                "The output layer's head and tail are on the meta device with no initial weight seed: build the model "
                "(`HasteForExtremeClassification`) within `deferred_output_rows()`, which initialises it, before sharding."
            )
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "Sharding the output layer needs an initialised torch.distributed process group (torchrun, accelerate launch)."
            )
        fingerprint = _fingerprint(layer).to(communication_device(group))
        low, high = fingerprint.clone(), fingerprint.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
        if not torch.equal(low, high):
            raise ValueError(
                "The ranks hold different output layers or label orders: build the model identically on every rank "
                "(seed before building it, and broadcast the label grouping) before sharding it."
            )
        # Takes over the layer's settings, modules and buffers as they are: no full-size tensor is rebuilt.
        shard = cls.__new__(cls)
        shard.__dict__.update(layer.__dict__)
        for registry in ("_parameters", "_buffers", "_modules"):
            setattr(shard, registry, dict(getattr(layer, registry)))
        shard.rank, shard.world_size, shard.group = dist.get_rank(group), dist.get_world_size(group), group
        shard.slices = assign_output_layer(layer.head_label_count, layer.tail_group_count, shard.world_size)
        shard.head_rows, shard.tail_groups = shard.slices[shard.rank].head_rows, shard.slices[shard.rank].tail_groups
        with torch.no_grad():
            if shard.head is not None:
                rows = shard.local_rows("head.weight")
                shard._cut(shard.head, {"weight": rows, "bias": rows}, rows_device)
                shard.head.out_features = rows.stop - rows.start
            if shard.tail is not None:
                groups = shard.local_rows("tail.weight")
                tail_rows = {"weight": groups, "bias": shard.local_rows("tail.bias"), "supports": groups}
                shard._cut(shard.tail, tail_rows, rows_device)
            if deferred and initialize:  # else left empty, for rows read from a saved folder next
                initialize_output_rows_(shard, layer.initial_weight_seed, layer.initial_head_std)
            # The label ids of this share's positions alone (8 GB whole at 10^9 labels, on every GPU, and as much
            # again for the inverse map): the head's rows, then the tail groups' slots.
            tail, whole = shard.local_rows("tail.bias"), layer.output_labels
            device = rows_device or ("cpu" if whole.device.type == "meta" else whole.device)
            labels = torch.empty(shard.head_width + tail.stop - tail.start, dtype=torch.int64, device=device)
            _output_labels_into(layer, labels[: shard.head_width], shard.head_rows[0])
            _output_labels_into(layer, labels[shard.head_width :], shard.head_label_count + tail.start)
            shard._buffers["output_labels"] = labels
        shard._lookup_cache = shard.output_label_source = None
        return shard

    @staticmethod
    def _cut(module: nn.Module, rows: dict[str, slice], device=None) -> None:
        """Keeps the rows `rows[name]` of each tensor; of one on the meta device, an empty tensor of their size on
        `device` (default: the CPU)."""

        def kept_rows(tensor, kept):
            if tensor.device.type == "meta":
                shape = (kept.stop - kept.start, *tensor.shape[1:])
                return torch.empty(shape, dtype=tensor.dtype, device=device or "cpu")
            return tensor.detach()[kept].clone()

        for name, kept in rows.items():
            if name in module._buffers:
                module._buffers[name] = kept_rows(module._buffers[name], kept)
            elif getattr(module, name) is not None:
                param = getattr(module, name)
                setattr(module, name, nn.Parameter(kept_rows(param, kept), requires_grad=param.requires_grad))

    def row_counts(self, name: str) -> list[int]:
        """Rows of the sharded tensor `name` (see `SHARDED_TENSORS`) on each rank."""
        if name.startswith("head."):
            return [stop - start for start, stop in (s.head_rows for s in self.slices)]
        per_group = self.group_size if name == "tail.bias" else 1
        return [(stop - start) * per_group for start, stop in (s.tail_groups for s in self.slices)]

    def local_rows(self, name: str) -> slice:
        counts = self.row_counts(name)
        start = sum(counts[: self.rank])
        return slice(start, start + counts[self.rank])

    # ---------------------------------------------------------------------------------- labels

    @property
    def head_width(self) -> int:
        return self.head_rows[1] - self.head_rows[0]

    def _share_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Output positions of this share (global) -> indices into its `output_labels` (head rows, then tail slots)."""
        return torch.where(
            positions < self.head_label_count,
            positions - self.head_rows[0],
            positions - self.tail_first_position + self.head_width,
        )

    def _global_positions(self, index: torch.Tensor) -> torch.Tensor:
        return torch.where(
            index < self.head_width, index + self.head_rows[0], index - self.head_width + self.tail_first_position
        )

    @property
    def label_positions(self):
        raise ValueError(
            "A share of a sharded output layer holds the label ids of its own positions only, no [label_count] map: "
            "gather the layer whole (`full_state_dict`) or load the saved model in one process for it."
        )

    def _share_lookup(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This share's label ids sorted, and the output position of each (cached while `output_labels` is
        unchanged): int32 where the ids fit, 2 x 4 bytes a position instead of an [L] int64 map of every label."""
        labels = self.output_labels
        key = (labels.data_ptr(), labels._version, labels.device)
        if self._lookup_cache is None or self._lookup_cache[0] != key:
            dtype = torch.int32 if self.label_count < 2**31 else torch.int64
            ids, order = labels.to(dtype).sort()
            self._lookup_cache = (key, ids, self._global_positions(order).to(dtype))
        return self._lookup_cache[1:]

    def _positions_of_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Label ids -> their output positions where this share holds them, else -1."""
        sorted_ids, positions = self._share_lookup()
        if sorted_ids.numel() == 0:
            return torch.full_like(ids, -1)
        ids = ids.to(sorted_ids.dtype)
        found = torch.searchsorted(sorted_ids, ids).clamp(max=sorted_ids.numel() - 1)
        return torch.where(sorted_ids[found] == ids, positions[found].long(), -1)

    def positive_positions(self, labels: torch.Tensor) -> torch.Tensor:
        """`HasteOutputLayer.positive_positions` of this share: positions of the labels it holds, -1 elsewhere."""
        return positive_positions(labels, self._positions_of_ids, self.label_count)

    # ---------------------------------------------------------------------------------- scoring

    def _gather_inputs(self, features: torch.Tensor, grad_scale: float):
        """The head and tail inputs of the global batch, in one collective where they share a dtype."""
        sizes = all_gather_sizes([features.shape[0]], self.group)[:, 0].tolist()
        head_x, tail_x = self.branch_inputs(features)
        if head_x is None or tail_x is None or head_x is tail_x:
            gathered = gather_rows_with_gradient(head_x if tail_x is None else tail_x, sizes, self.group, grad_scale)
            return (None if head_x is None else gathered), (None if tail_x is None else gathered), sizes
        if head_x.dtype == tail_x.dtype:
            gathered = gather_rows_with_gradient(torch.cat([head_x, tail_x], dim=1), sizes, self.group, grad_scale)
            head_x, tail_x = gathered.split([head_x.shape[1], tail_x.shape[1]], dim=1)
            return head_x, tail_x, sizes
        head_x, tail_x = (gather_rows_with_gradient(x, sizes, self.group, grad_scale) for x in (head_x, tail_x))
        return head_x, tail_x, sizes

    def _gather_labels(self, labels: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Positive label ids of the global batch `[B_global, P]`, -100 padded."""
        dense = self.dense_labels(labels, sizes[self.rank])
        if dense is not None:
            if bool(((dense != 0) & (dense != 1)).any()):
                raise ValueError(
                    "A sharded output layer takes 0/1 multi-hot `labels` or padded positive ids, not soft targets."
                )
            labels = _multi_hot_to_ids(dense.bool())
        width = int(all_gather_sizes([labels.shape[1]], self.group)[:, 0].max())
        labels = F.pad(labels.to(torch.int64), (0, width - labels.shape[1]), value=LABEL_PADDING_ID)
        return all_gather_rows(labels, sizes, self.group, pad_value=LABEL_PADDING_ID)

    def forward(
        self,
        features: torch.Tensor,
        labels: torch.Tensor | None = None,
        top_k: int | None = None,
        return_logits: bool | None = None,
    ) -> OutputLayerOutput:
        """The loss and top-k of this rank's examples, computed with the other ranks (no `[B, L]` logits).

        The loss's value is the global batch's loss, on every rank; its gradient is this rank's part (its
        labels over the global batch), which with DDP's averaging gives every parameter the gradient of the
        global loss.
        """
        if return_logits:
            raise ValueError(
                "A sharded output layer gives no [batch, label_count] logits: pass `top_k` for the best labels."
            )
        if top_k is not None:
            self.check_k(top_k)
        head_x, tail_x, sizes = self._gather_inputs(features, grad_scale=self.world_size)
        loss = None
        if labels is not None:
            positions = self.positive_positions(self._gather_labels(labels, sizes))
            partial = self.scored_loss(head_x, tail_x, positions, self._loss_scale(sum(sizes)))
            total = partial.detach().clone()
            dist.all_reduce(total, group=self.group)
            loss = partial + (total - partial.detach())
        top_scores = top_label_ids = None
        if top_k is not None:
            with torch.no_grad():
                top_scores, top_label_ids = self._merge_across_ranks(
                    self.scored_topk(head_x, tail_x, top_k), top_k, sizes
                )
        return OutputLayerOutput(loss=loss, top_label_ids=top_label_ids, top_scores=top_scores)

    @torch.no_grad()
    def topk(self, features: torch.Tensor, k: int) -> TopKOutput:
        """The `k` best labels of this rank's examples: every rank's top-k of its labels over the global
        batch, merged."""
        self.check_k(k)
        head_x, tail_x, sizes = self._gather_inputs(features, grad_scale=1.0)
        scores, label_ids = self._merge_across_ranks(self.scored_topk(head_x, tail_x, k), k, sizes)
        return TopKOutput(label_ids=label_ids, scores=scores)

    def _merge_across_ranks(self, best, k: int, sizes: list[int]):
        """Every rank's top-k of the global batch -> the global top-k of this rank's examples."""
        scores, positions = best
        missing = k - scores.shape[1]
        if missing > 0:  # fewer labels here than k
            scores = F.pad(scores, (0, missing), value=float("-inf"))
            positions = F.pad(positions, (0, missing), value=-1)
        if self.output_labels.numel():
            label_ids = torch.where(positions >= 0, self.output_labels[self._share_index(positions).clamp(min=0)], -1)
        else:  # an empty share: its top-k is padding alone
            label_ids = torch.full_like(positions, -1)
        gathered_scores = all_gather_rows(scores.unsqueeze(0), [1] * self.world_size, self.group)
        gathered_ids = all_gather_rows(label_ids.unsqueeze(0), [1] * self.world_size, self.group)
        start = sum(sizes[: self.rank])
        rows = slice(start, start + sizes[self.rank])
        width = self.world_size * k  # not -1: this rank's share of the batch may have no rows
        candidates = gathered_scores[:, rows].permute(1, 0, 2).reshape(sizes[self.rank], width)
        candidate_ids = gathered_ids[:, rows].permute(1, 0, 2).reshape(sizes[self.rank], width)
        top_scores, top = candidates.topk(k, dim=1)
        return top_scores, candidate_ids.gather(1, top)

    # ---------------------------------------------------------------------------------- training upkeep

    @torch.no_grad()
    def rewire_(self, fraction, scope, init, seed, step, score="mean_abs") -> tuple[RewiringResult, int]:
        """`haste_hf.modeling.rewiring.rewire_` of the whole tail, applied to this rank's groups: the slot scores and
        supports of all ranks are gathered, the same pairs are pruned and regrown as by one process, and
        each rank keeps its groups. Returns this rank's changes (group indices local) and the total count."""
        tail = self.tail
        local_groups, group_size, fan_in = tail.weight.shape
        check_rewiring_options(fraction, scope, init, zero_fraction_ok=True, score=score)
        positions = self.output_labels[self.head_width : self.head_width + local_groups * group_size]
        scores = group_slot_scores(tail.weight, (positions >= 0).view(local_groups, group_size), score)
        counts = self.row_counts("tail.weight")
        device = communication_device(self.group)
        all_scores = all_gather_rows(scores.to(device), counts, self.group)
        all_supports = all_gather_rows(tail.supports.to(device), counts, self.group)
        check_supports(all_supports, sum(counts), fan_in, tail.in_features)
        groups, slots, old, new, generator = regrow_weakest_(
            all_scores, all_supports, tail.in_features, fraction, scope, seed, step
        )
        first = self.tail_groups[0]
        tail.supports.copy_(all_supports[first : first + local_groups])
        groups, slots, old, new = (t.to(tail.weight.device) for t in (groups, slots, old, new))
        reset_pruned_weights_(tail.weight, groups, slots, init, generator, first_group=first)
        mine = (groups >= first) & (groups < first + local_groups)
        result = RewiringResult(groups[mine] - first, slots[mine], old[mine], new[mine], local_groups, fan_in)
        return result, groups.numel()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over the output parameters of all ranks' shares together."""
        grads = [p.grad for p in self.output_parameters() if p.grad is not None]
        device = communication_device(self.group)
        squares = torch.zeros((), dtype=torch.float32, device=device)
        for grad in grads:
            squares += grad.float().pow(2).sum().to(device)
        dist.all_reduce(squares, group=self.group)
        total = squares.sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.device, grad.dtype))
        return total

    # ---------------------------------------------------------------------------------- saving and loading

    def gather_full(self, state: dict, prefix: str = "", dst: int = 0) -> dict | None:
        """`state` (tensors by state-dict name, this layer's under `prefix`) with the sharded ones gathered
        whole on rank `dst`, None elsewhere."""
        full = dict(state) if self.rank == dst else None
        for name in self.SHARDED_TENSORS:
            if prefix + name in state:
                gathered = gather_rows_to_cpu(state[prefix + name], self.row_counts(name), dst, self.group)
                if full is not None:
                    full[prefix + name] = gathered
        if prefix + "output_labels" in state:  # each rank's head rows, then its tail slots
            labels = state[prefix + "output_labels"]
            parts = [
                gather_rows_to_cpu(part, self.row_counts(name), dst, self.group)
                for part, name in zip(labels.split([self.head_width, labels.numel() - self.head_width]), SPLIT_BY)
            ]
            if full is not None:
                full[prefix + "output_labels"] = torch.cat(parts)
        return full

    def full_state_dict(self, model: nn.Module, dst: int = 0) -> dict | None:
        """`model`'s unsharded state dict on rank `dst` (this layer's shares gathered to the CPU), None elsewhere."""
        return self.gather_full(model.state_dict(), layer_prefix(model), dst)

    def _output_parameter_names(self, output_state: dict) -> list[str]:
        """Names (in this layer) of the output optimizer's parameters, in its state-dict numbering."""
        trained = {id(param) for param in self.output_parameters()}
        names = [name for name, param in self.named_parameters() if id(param) in trained]
        numbered = sorted(index for group in output_state["param_groups"] for index in group["params"])
        if len(numbered) != len(names):
            raise ValueError(
                f"The output optimizer's state holds {len(numbered)} parameters where the model's output layer has "
                f"{len(names)}: it was saved from another model."
            )
        return names

    def local_optimizer_state(self, full_state: dict) -> dict:
        """This rank's rows of a whole output optimizer state (the optimizer.pt of a checkpoint saved before sharded
        runs saved their rows in shards, `haste_hf.training.shard_checkpoints`)."""
        names = self._output_parameter_names(full_state)
        state = {}
        for index, entry in full_state["state"].items():
            name = names[index]
            state[index] = {
                key: (
                    value[self.local_rows(name)]
                    if isinstance(value, torch.Tensor) and value.dim() > 0 and name in self.SHARDED_TENSORS
                    else value
                )
                for key, value in entry.items()
            }
        return {"state": state, "param_groups": full_state["param_groups"]}


def sharded_output_layer(model: nn.Module) -> ShardedOutputLayer | None:
    """The model's output layer when it holds one rank's share, else None."""
    layer = getattr(model, "output_layer", None)
    return layer if isinstance(layer, ShardedOutputLayer) else None


def shard_output_layer_(model: nn.Module, group=None, initialize: bool = True, rows_device=None) -> ShardedOutputLayer:
    """Replaces a HASTE model's output layer by this rank's share (`ShardedOutputLayer.shard`, collective)
    and returns it (the existing one if already sharded).

    Under DDP, the sharded parameters must be left out of DDP's averaging: `HasteTrainer` does it, or call
    `ignore_shards_in_ddp(model)` before wrapping.
    """
    if sharded_output_layer(model) is None:
        model.output_layer = ShardedOutputLayer.shard(model.output_layer, group, initialize, rows_device)
    return model.output_layer


def ignore_shards_in_ddp(model: nn.Module) -> None:
    """Leaves the sharded tensors out of DDP's parameter averaging and buffer broadcasts."""
    from torch.nn.parallel import DistributedDataParallel

    layer = model.output_layer
    prefix = layer_prefix(model)
    present = dict(model.named_parameters()) | dict(model.named_buffers())
    # `output_labels` too: each rank holds its share's label ids, which DDP's buffer broadcast would overwrite.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [prefix + name for name in (*layer.SHARDED_TENSORS, "output_labels") if prefix + name in present]
    )


__all__ = [
    "OutputLayerSlice",
    "ShardedOutputLayer",
    "assign_output_layer",
    "ignore_shards_in_ddp",
    "resolve_shard_output_layer",
    "shard_output_layer_",
    "sharded_output_layer",
]
