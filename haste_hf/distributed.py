# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Several GPUs: the output layer sharded by labels, the encoder data-parallel.

Plain data parallelism replicates the output layer and all-reduces its gradient every step, O(L * F)
bytes (1.1 GB of bf16 at 8.6M labels). Sharded, as the "partial FC" of large-scale face recognition:

- each rank holds a contiguous share of the dense head's rows and of the tail's groups
  (`assign_output_layer`), and the whole encoder under DDP, which leaves the shares alone;
- the branch inputs `[B_local, d]` (pooled, projected) and the positive label ids are all-gathered, so
  each rank scores its labels over the global batch: its part of the loss, its weight gradients, its
  share of every example's top-k (merged across ranks, never an `[N, L]` matrix);
- the feature gradient is reduce-scattered back to the rank of each example, scaled by the world size
  because DDP averages the encoder's gradients where the sharded loss is a sum over ranks.

Communication per step is O(B * d) instead of O(L * F). Rewiring gathers the tail's slot scores and
supports (every `rewiring_interval` steps) and runs the same pure function of (seed, step, weights) as
one process, so a sharded run equals the single-process run of the same global batch. Saving gathers
one ordinary HASTE checkpoint on rank 0; loading reads each rank's rows only. Everything goes through
torch.distributed (NCCL on GPUs, gloo on CPUs).
"""

import json
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .losses import output_layer_loss
from .modeling_haste import _TOPK_CHUNK_ELEMENTS, HasteForExtremeClassification, TopKOutput
from .rewiring import (
    RewiringResult,
    check_rewiring_options,
    check_supports,
    group_slot_scores,
    regrow_weakest_,
    reset_pruned_weights_,
)
from .sparse_ops import group_sparse_topk, merge_topk


# Bounds the rows one rank sends per gather when a checkpoint is assembled, so saving never holds more
# than this many bytes of another rank's share on the GPU at once.
_GATHER_CHUNK_BYTES = 1 << 28


# ------------------------------------------------------------------------------------------------ plan


def balanced_ranges(count: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous `[start, stop)` ranges covering `range(count)`, the first `count % parts` one
    longer than the rest."""
    if parts < 1:
        raise ValueError(f"`parts` must be >= 1, got {parts}.")
    size, extra = divmod(count, parts)
    bounds = [0]
    for part in range(parts):
        bounds.append(bounds[-1] + size + (part < extra))
    return list(zip(bounds[:-1], bounds[1:]))


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


# ------------------------------------------------------------------------------------------------ collectives


def communication_device(group=None) -> torch.device:
    """Where tensors must live for the collectives of `group`: the current GPU under NCCL, else the CPU."""
    if dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_sizes(values: list[int], group=None) -> torch.Tensor:
    """`[world_size, len(values)]` int64: every rank's `values`."""
    local = torch.tensor([values], dtype=torch.int64, device=communication_device(group))
    gathered = torch.empty(dist.get_world_size(group), len(values), dtype=torch.int64, device=local.device)
    dist.all_gather_into_tensor(gathered, local, group=group)
    return gathered.cpu()


def _padded(x: torch.Tensor, rows: int, value=0) -> torch.Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    pad = x.new_full((rows - x.shape[0], *x.shape[1:]), value)
    return torch.cat([x, pad])


def all_gather_rows(x: torch.Tensor, counts: list[int], group=None, pad_value=0) -> torch.Tensor:
    """The rows of every rank, in rank order (`counts[r]` rows from rank r), without autograd."""
    most = max(counts)
    gathered = x.new_empty(len(counts) * most, *x.shape[1:])
    dist.all_gather_into_tensor(gathered, _padded(x, most, pad_value), group=group)
    if all(count == most for count in counts):
        return gathered
    return torch.cat([gathered[rank * most : rank * most + count] for rank, count in enumerate(counts)])


def reduce_scatter_rows(x: torch.Tensor, counts: list[int], group=None) -> torch.Tensor:
    """Rows summed over ranks, each rank keeping its own `counts[rank]` rows (the adjoint of
    `all_gather_rows`)."""
    most, rank = max(counts), dist.get_rank(group)
    if any(count != most for count in counts):
        starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
        x = torch.cat([_padded(x[starts[r] : starts[r + 1]], most) for r in range(len(counts))])
    out = x.new_empty(most, *x.shape[1:])
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out[: counts[rank]]


class _GatherRowsFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, counts, group, grad_scale):
        ctx.counts, ctx.group, ctx.grad_scale = counts, group, grad_scale
        return all_gather_rows(x, counts, group)

    @staticmethod
    def backward(ctx, grad):
        local = reduce_scatter_rows(grad, ctx.counts, ctx.group)
        return (local * ctx.grad_scale if ctx.grad_scale != 1 else local), None, None, None


def gather_rows_with_gradient(x: torch.Tensor, counts: list[int], group=None, grad_scale: float = 1.0) -> torch.Tensor:
    """`all_gather_rows` whose backward reduce-scatters the gradient (times `grad_scale`) to each row's rank."""
    return _GatherRowsFunction.apply(x, counts, group, grad_scale)


def gather_rows_to_cpu(x: torch.Tensor, counts: list[int], dst: int = 0, group=None) -> torch.Tensor | None:
    """Rank `dst` gets every rank's rows concatenated, on the CPU; the others get None. Sent in pieces of
    at most `_GATHER_CHUNK_BYTES` per rank, so no GPU ever holds the whole tensor."""
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    device = communication_device(group)
    row_bytes = x.element_size() * max(1, math.prod(x.shape[1:]))
    step = max(1, _GATHER_CHUNK_BYTES // (row_bytes * world_size))
    full = torch.empty(sum(counts), *x.shape[1:], dtype=x.dtype) if rank == dst else None
    starts = [0, *torch.tensor(counts).cumsum(0).tolist()]
    for offset in range(0, max(counts), step):
        piece = _padded(x[offset : offset + step].to(device), min(step, max(counts) - offset))
        pieces = [torch.empty_like(piece) for _ in range(world_size)] if rank == dst else None
        dist.gather(piece, pieces, dst=dst, group=group)
        if rank == dst:
            for source, received in enumerate(pieces):
                valid = max(0, min(received.shape[0], counts[source] - offset))
                full[starts[source] + offset : starts[source] + offset + valid] = received[:valid].cpu()
    return full


def broadcast_object(value, src: int = 0, group=None):
    """`value` of rank `src` on every rank (a no-op without an initialised process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=src, group=group, device=communication_device(group))
    return holder[0]


# ------------------------------------------------------------------------------------------------ the shard


class OutputLayerShard:
    """This rank's share of a HASTE model's output layer, and the sharded steps that use it.

    Built by `shard_output_layer_`, kept as ``model.output_layer_shard``; the model's `forward` and
    `predict_topk` hand the output layer to it. Every method that communicates is a collective: all ranks
    call it, with their own batches (of any size, also empty).
    """

    SHARDED_TENSORS = ("head.weight", "head.bias", "tail.weight", "tail.bias", "tail.supports")

    def __init__(self, config, rank: int, world_size: int, group=None):
        self.rank, self.world_size, self.group = rank, world_size, group
        self.slices = assign_output_layer(config.head_label_count, config.tail_group_count, world_size)
        self.head_rows = self.slices[rank].head_rows
        self.tail_groups = self.slices[rank].tail_groups
        self.head_label_count, self.group_size = config.head_label_count, config.group_size
        self.label_count, self.loss_reduction = config.label_count, config.loss_reduction

    # ---------------------------------------------------------------------------------- layout

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

    @property
    def tail_first_position(self) -> int:
        return self.head_label_count + self.tail_groups[0] * self.group_size

    def _local_columns(self, positions: torch.Tensor) -> torch.Tensor:
        """Global output positions -> columns of this rank's logits `[head rows, tail slots]`, -1 elsewhere."""
        head_start, head_stop = self.head_rows
        head_width = head_stop - head_start
        tail_start = self.tail_first_position
        tail_stop = self.head_label_count + self.tail_groups[1] * self.group_size
        in_head = (positions >= head_start) & (positions < head_stop)
        in_tail = (positions >= tail_start) & (positions < tail_stop)
        columns = torch.where(in_head, positions - head_start, positions - tail_start + head_width)
        return torch.where(in_head | in_tail, columns, -1)

    # ---------------------------------------------------------------------------------- steps

    def _gather_inputs(self, model, pooled: torch.Tensor, grad_scale: float):
        """The head and tail inputs of the global batch, in one collective where they share a dtype."""
        sizes = all_gather_sizes([pooled.shape[0]], self.group)[:, 0].tolist()
        head_x, tail_x = model._branch_inputs(pooled)
        if head_x is None or tail_x is None or head_x is tail_x:
            gathered = gather_rows_with_gradient(head_x if tail_x is None else tail_x, sizes, self.group, grad_scale)
            return (None if head_x is None else gathered), (None if tail_x is None else gathered), sizes
        if head_x.dtype == tail_x.dtype:
            gathered = gather_rows_with_gradient(torch.cat([head_x, tail_x], dim=1), sizes, self.group, grad_scale)
            head_x, tail_x = gathered.split([head_x.shape[1], tail_x.shape[1]], dim=1)
            return head_x, tail_x, sizes
        head_x, tail_x = (gather_rows_with_gradient(x, sizes, self.group, grad_scale) for x in (head_x, tail_x))
        return head_x, tail_x, sizes

    @property
    def head_width(self) -> int:
        return self.head_rows[1] - self.head_rows[0]

    @property
    def valid_tail_count(self) -> int:
        """This rank's tail columns that are labels: all but the padding slots of the last group, which trail
        the last rank's columns."""
        tail_stop = self.head_label_count + self.tail_groups[1] * self.group_size
        return max(0, min(tail_stop, self.label_count) - self.tail_first_position)

    def _gather_labels(self, model, labels: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Positive label ids of the global batch `[B_global, P]`, -100 padded."""
        dense = model._dense_labels(labels, sizes[self.rank])
        if dense is not None:
            if bool(((dense != 0) & (dense != 1)).any()):
                raise ValueError("A sharded output layer takes 0/1 multi-hot `labels` or padded positive ids, not soft targets.")
            labels = _multi_hot_to_ids(dense.bool())
        width = int(all_gather_sizes([labels.shape[1]], self.group)[:, 0].max())
        labels = F.pad(labels.to(torch.int64), (0, width - labels.shape[1]), value=-100)
        return all_gather_rows(labels, sizes, self.group, pad_value=-100)

    def _local_loss(self, model, head_x, tail_x, positions: torch.Tensor, scale: float) -> torch.Tensor:
        """This rank's labels' part of the loss, through the fused op of one process on each slice (positions
        shifted to the slice's first column; those of other ranks fall outside it and are ignored)."""
        losses = []
        if model.head is not None:
            losses.append(output_layer_loss(
                head_x, model.head.weight, model.head.bias, positions - self.head_rows[0], self.head_width, scale,
                model.config.loss,
            ))  # fmt: skip
        if model.tail is not None:
            losses.append(output_layer_loss(
                tail_x, model.tail.weight, model.tail.bias, positions - self.tail_first_position, self.valid_tail_count,
                scale, model.config.loss, supports=model.tail.supports,
            ))  # fmt: skip
        return losses[0] if len(losses) == 1 else losses[0] + losses[1]

    def _local_topk(self, model, head_x, tail_x, k: int):
        """The `k` best (fp32 scores, global output positions) among this rank's labels, without its logits."""
        reference = head_x if head_x is not None else tail_x
        batch_size = reference.shape[0]
        best = (reference.new_empty(batch_size, 0, dtype=torch.float32), reference.new_empty(batch_size, 0, dtype=torch.int64))
        if model.head is not None:
            step = max(1, _TOPK_CHUNK_ELEMENTS // max(1, batch_size))
            for start in range(0, self.head_width, step):
                rows = slice(start, min(start + step, self.head_width))
                bias = None if model.head.bias is None else model.head.bias[rows]
                logits = F.linear(head_x, model.head.weight[rows], bias)
                best = merge_topk(best, model._top_positions(logits, k, self.head_rows[0] + start), k)
        if model.tail is not None:
            scores, columns = group_sparse_topk(
                tail_x, model.tail.weight, model.tail.supports, model.tail.bias, k, self.valid_tail_count,
                chunk_elements=_TOPK_CHUNK_ELEMENTS,
            )  # fmt: skip
            best = merge_topk(best, (scores, columns.clamp(min=0) + self.tail_first_position), k)
        return best

    def forward(self, model, pooled: torch.Tensor, labels: torch.Tensor | None, top_k: int | None):
        """(loss, top scores, top label ids) of this rank's examples, computed with the other ranks.

        The loss's value is the global batch's loss, on every rank; its gradient is this rank's part (its
        labels over the global batch), which with DDP's averaging gives every parameter the gradient of the
        global loss.
        """
        if top_k is not None:
            model._check_k(top_k)
        head_x, tail_x, sizes = self._gather_inputs(model, pooled, grad_scale=self.world_size)
        loss = None
        if labels is not None:
            positions = model._positive_positions(self._gather_labels(model, labels, sizes))
            scale = 1.0 / (sum(sizes) * (self.label_count if self.loss_reduction == "mean" else 1))
            partial = self._local_loss(model, head_x, tail_x, positions, scale)
            total = partial.detach().clone()
            dist.all_reduce(total, group=self.group)
            loss = partial + (total - partial.detach())
        top_scores = top_label_ids = None
        if top_k is not None:
            with torch.no_grad():
                best = self._local_topk(model, head_x, tail_x, top_k)
                top_scores, top_label_ids = self._merge_across_ranks(model, best, top_k, sizes)
        return loss, top_scores, top_label_ids

    @torch.no_grad()
    def predict_topk(self, model, pooled: torch.Tensor, k: int) -> TopKOutput:
        """The `k` best labels of this rank's examples: every rank's top-k of its labels over the global
        batch, merged."""
        model._check_k(k)
        head_x, tail_x, sizes = self._gather_inputs(model, pooled, grad_scale=1.0)
        scores, label_ids = self._merge_across_ranks(model, self._local_topk(model, head_x, tail_x, k), k, sizes)
        return TopKOutput(label_ids=label_ids, scores=scores)

    def _merge_across_ranks(self, model, best, k: int, sizes: list[int]):
        """Every rank's top-k of the global batch -> the global top-k of this rank's examples."""
        scores, positions = best
        missing = k - scores.shape[1]
        if missing > 0:  # fewer labels here than k
            scores = F.pad(scores, (0, missing), value=float("-inf"))
            positions = F.pad(positions, (0, missing), value=-1)
        label_ids = torch.where(positions >= 0, model.output_labels[positions.clamp(min=0)], -1)
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
    def rewire_(self, model, fraction, scope, init, seed, step) -> tuple[RewiringResult, int]:
        """`haste_hf.rewiring.rewire_` of the whole tail, applied to this rank's groups: the slot scores and
        supports of all ranks are gathered, the same pairs are pruned and regrown as by one process, and
        each rank keeps its groups. Returns this rank's changes (group indices local) and the total count."""
        tail = model.tail
        local_groups, group_size, fan_in = tail.weight.shape
        check_rewiring_options(fraction, scope, init, zero_fraction_ok=True)
        positions = model.output_labels[self.tail_first_position : self.tail_first_position + local_groups * group_size]
        scores = group_slot_scores(tail.weight, (positions >= 0).view(local_groups, group_size))
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
    def clip_grad_norm_(self, parameters, max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_` over the parameters of all ranks' shares together."""
        grads = [p.grad for p in parameters if p.grad is not None]
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

    def full_state_dict(self, model, dst: int = 0) -> dict | None:
        """The unsharded state dict on rank `dst` (sharded tensors gathered to the CPU), None elsewhere."""
        return self.gather_full(model.state_dict(), dst)

    def gather_full(self, state: dict, dst: int = 0) -> dict | None:
        """`state` (tensors by state-dict name) with the sharded ones gathered whole on rank `dst`, None
        elsewhere."""
        full = dict(state) if self.rank == dst else None
        for name in self.SHARDED_TENSORS:
            if name in state:
                gathered = gather_rows_to_cpu(state[name], self.row_counts(name), dst, self.group)
                if full is not None:
                    full[name] = gathered
        return full

    def load_checkpoint_(self, model, folder: str) -> None:
        """Loads this rank's rows of a HASTE checkpoint folder (one safetensors file or an indexed set),
        reading only those rows of the sharded tensors."""
        from safetensors import safe_open

        from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

        index_path = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
        if os.path.isfile(index_path):
            with open(index_path) as f:
                files = json.load(f)["weight_map"]
        elif os.path.isfile(os.path.join(folder, SAFE_WEIGHTS_NAME)):
            files = None
        else:
            raise FileNotFoundError(f"No {SAFE_WEIGHTS_NAME} (or its index) in {folder}: not a HASTE checkpoint folder.")
        expected = model.state_dict()
        local = {}
        handles = {}
        for name, target in expected.items():
            path = os.path.join(folder, files[name] if files is not None and name in files else SAFE_WEIGHTS_NAME)
            if path not in handles:
                handles[path] = safe_open(path, framework="pt")
            handle = handles[path]
            if name not in handle.keys():
                raise KeyError(f"{folder} holds no tensor {name!r}: it is not a checkpoint of this model.")
            if name in self.SHARDED_TENSORS:
                rows = self.local_rows(name)
                value = handle.get_slice(name)[rows.start : rows.stop]
            else:
                value = handle.get_tensor(name)
            if value.shape != target.shape:
                raise ValueError(f"{folder}: {name} has shape {tuple(value.shape)} where this rank needs {tuple(target.shape)}.")
            local[name] = value
        model.load_state_dict(local, strict=False)

    def full_optimizer_state(self, model, output_state: dict, dst: int = 0) -> dict | None:
        """The output optimizer's state dict with every per-weight tensor (momentum) gathered to rank `dst`."""
        names = self._output_parameter_names(model, output_state)
        full = {"state": {}, "param_groups": output_state["param_groups"]} if self.rank == dst else None
        for index, name in enumerate(names):
            entry = output_state["state"].get(index, {})
            gathered = {}
            for key, value in sorted(entry.items()):
                if isinstance(value, torch.Tensor) and value.dim() > 0 and name in self.SHARDED_TENSORS:
                    value = gather_rows_to_cpu(value, self.row_counts(name), dst, self.group)
                gathered[key] = value
            if full is not None and entry:
                full["state"][index] = gathered
        return full

    def local_optimizer_state(self, model, full_state: dict) -> dict:
        names = self._output_parameter_names(model, full_state)
        state = {}
        for index, entry in full_state["state"].items():
            name = names[index]
            state[index] = {
                key: (value[self.local_rows(name)] if isinstance(value, torch.Tensor) and value.dim() > 0 and name in self.SHARDED_TENSORS else value)
                for key, value in entry.items()
            }
        return {"state": state, "param_groups": full_state["param_groups"]}

    @staticmethod
    def _output_parameter_names(model, output_state: dict) -> list[str]:
        """Names of the output optimizer's parameters, in its state-dict numbering (the model's order)."""
        from .trainer import OUTPUT_LAYER_MODULES

        names = [name for name, p in model.named_parameters() if p.requires_grad and name.split(".", 1)[0] in OUTPUT_LAYER_MODULES]
        numbered = sorted(index for group in output_state["param_groups"] for index in group["params"])
        if len(numbered) != len(names):
            raise ValueError(
                f"The output optimizer's state holds {len(numbered)} parameters where the model's output layer has "
                f"{len(names)}: it was saved from another model."
            )
        return names


def _multi_hot_to_ids(labels: torch.Tensor) -> torch.Tensor:
    """Bool `[B, L]` -> positive ids `[B, P]` padded with -100."""
    counts = labels.sum(1)
    width = int(counts.max()) if labels.shape[0] else 0
    ids = torch.full((labels.shape[0], width), -100, dtype=torch.int64, device=labels.device)
    rows, columns = torch.nonzero(labels, as_tuple=True)
    starts = torch.cumsum(counts, 0) - counts
    ids[rows, torch.arange(rows.numel(), device=labels.device) - starts[rows]] = columns
    return ids


# ------------------------------------------------------------------------------------------------ sharding


def _slice_module_(module: nn.Module, parameter_rows: dict[str, slice], buffer_rows: dict[str, slice]) -> None:
    for name, rows in parameter_rows.items():
        param = getattr(module, name)
        if param is not None:
            setattr(module, name, nn.Parameter(param.detach()[rows].clone(), requires_grad=param.requires_grad))
    for name, rows in buffer_rows.items():
        module._buffers[name] = module._buffers[name][rows].clone()


def _fingerprint(model) -> torch.Tensor:
    """A float64 vector that differs between ranks whose output layers (or label order) differ."""
    values = [model.output_labels.double().mul(torch.arange(1, model.output_labels.numel() + 1, dtype=torch.float64, device=model.output_labels.device)).sum()]
    for module in (model.head, model.tail):
        if module is not None:
            values.extend(t.detach().double().sum() for t in module.state_dict().values())
    return torch.stack([v.cpu() for v in values])


def shard_output_layer_(model: HasteForExtremeClassification, group=None) -> OutputLayerShard:
    """Keeps this rank's share of `model`'s head and tail (see `assign_output_layer`) and makes the model
    score through the shard (``model.output_layer_shard``). Collective: every rank calls it with the same
    model (same weights and label order, checked); returns the shard (the existing one if already sharded).

    Under DDP, the sharded parameters must be left out of DDP's averaging: `HasteTrainer` does it, or call
    `torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model,
    shard.SHARDED_TENSORS)` before wrapping.
    """
    if model.output_layer_shard is not None:
        return model.output_layer_shard
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("Sharding the output layer needs an initialised torch.distributed process group (torchrun, accelerate launch).")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    fingerprint = _fingerprint(model).to(communication_device(group))
    low, high = fingerprint.clone(), fingerprint.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(low, high):
        raise ValueError(
            "The ranks hold different output layers or label orders: build the model identically on every rank "
            "(seed before building it, and broadcast the label grouping) before sharding it."
        )
    shard = OutputLayerShard(model.config, rank, world_size, group)
    if model.head is not None:
        rows = shard.local_rows("head.weight")
        _slice_module_(model.head, {"weight": rows, "bias": rows}, {})
        model.head.out_features = rows.stop - rows.start
    if model.tail is not None:
        groups = shard.local_rows("tail.weight")
        _slice_module_(model.tail, {"weight": groups, "bias": shard.local_rows("tail.bias")}, {"supports": groups})
    model.output_layer_shard = shard
    return shard


def save_sharded_pretrained(model: HasteForExtremeClassification, save_directory, **kwargs) -> None:
    """`save_pretrained` of a sharded model as one ordinary HASTE checkpoint, written by rank 0 (collective:
    every rank calls it)."""
    shard = model.output_layer_shard
    state_dict = shard.full_state_dict(model)
    if shard.rank == 0:
        model.save_pretrained(save_directory, state_dict=state_dict, **kwargs)
    dist.barrier(group=shard.group)


def ignore_shards_in_ddp(model) -> None:
    """Leaves the sharded tensors out of DDP's parameter averaging and buffer broadcasts."""
    from torch.nn.parallel import DistributedDataParallel

    present = dict(model.named_parameters()) | dict(model.named_buffers())
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [name for name in OutputLayerShard.SHARDED_TENSORS if name in present]
    )


__all__ = [
    "OutputLayerShard",
    "OutputLayerSlice",
    "assign_output_layer",
    "balanced_ranges",
    "broadcast_object",
    "ignore_shards_in_ddp",
    "resolve_shard_output_layer",
    "save_sharded_pretrained",
    "shard_output_layer_",
]
