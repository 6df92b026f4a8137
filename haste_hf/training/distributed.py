# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The collectives of several processes (torch.distributed: NCCL on GPUs, gloo on CPUs) that the sharded
output layer (`haste_hf.training.sharded_output_layer`) and the recipe use: rows of every rank gathered, with or
without autograd, reduce-scattered back, gathered to the CPU in bounded pieces; objects broadcast (large ones through a
file); the group ended
without a hang.
"""

import gc
import math
import os
import sys
import tempfile
import types

import torch
import torch.distributed as dist


# Bounds the rows one rank sends per gather when a checkpoint is assembled, so saving never holds more
# than this many bytes of another rank's share on the GPU at once.
_GATHER_CHUNK_BYTES = 1 << 28


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


# ------------------------------------------------------------------------------------------------ collectives


def communication_device(group=None) -> torch.device:
    """Where tensors must live for the collectives of `group`: the current GPU under NCCL, else the CPU."""
    if dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# torch 2.13 renamed the tensor collectives (`all_gather_into_tensor` -> `all_gather_single`, `reduce_scatter_tensor` ->
# `reduce_scatter_single`) and warns on the old names; earlier versions have only those.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_sizes(values: list[int], group=None) -> torch.Tensor:
    """`[world_size, len(values)]` int64: every rank's `values`."""
    local = torch.tensor([values], dtype=torch.int64, device=communication_device(group))
    gathered = torch.empty(dist.get_world_size(group), len(values), dtype=torch.int64, device=local.device)
    _all_gather_single(gathered, local, group=group)
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
    _all_gather_single(gathered, _padded(x, most, pad_value), group=group)
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
    _reduce_scatter_single(out, x.contiguous(), group=group)
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


def broadcast_through_file(value, folder, save, load, group=None):
    """`value` of rank 0 on every rank, through a file: rank 0 writes it into `folder` (`save(value, path)`), the
    others read it (`load(path)`, which checks it). A large object (the label layout of 10^9 labels, 16 GB) then
    crosses no collective, which would pickle it whole and pass the bytes through every GPU. Where a rank cannot read
    the file (hosts that share no file system), every rank takes `broadcast_object`'s copy instead."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    rank, path = dist.get_rank(group), None
    if rank == 0:
        try:
            os.makedirs(folder, exist_ok=True)
            handle, path = tempfile.mkstemp(prefix=".haste-broadcast-", dir=folder)
            os.close(handle)
            save(value, path)
        except OSError:
            path = None  # every rank takes the broadcast copy below
    path = broadcast_object(path, group=group)
    loaded, failed = value, False
    if rank != 0 and path is not None:
        try:
            loaded = load(path)
        except (OSError, ValueError):
            failed = True
    failures = [None] * dist.get_world_size(group)
    dist.all_gather_object(failures, failed, group=group)  # every rank has read the file past this point
    if rank == 0 and path is not None:
        os.remove(path)
    if path is None or any(failures):
        return broadcast_object(value, group=group)
    return loaded


def end_process_group() -> None:
    """Ends this process's part of the default process group (a no-op without one). Call it once nothing that holds
    the group is alive: return first from the function that built the DDP wrapper, trainer or sharded layer.

    Why so: a DDP wrapper's reducer holds the group, and a trainer, its callbacks and its accelerator hold each other
    in reference cycles. Freed after `destroy_process_group`, at a later collection or at the interpreter's exit with
    the GIL held, the group's last reference goes in a C++ destructor that joins gloo's threads, one of which can be
    waiting for that GIL: the rank hangs after its work (py-spy: the main thread in native code at the caller's line,
    beside a thread with no Python frame), or aborts ("terminate called without an active exception"). Collected
    here, and torch's own import-time references dropped (`_release_import_time_references`), the last reference goes
    in `destroy_process_group`, with no collective in flight: gloo's threads have ended when this returns."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    gc.collect()
    _release_import_time_references(dist.group.WORLD)
    dist.destroy_process_group()


def _release_import_time_references(group) -> None:
    """Rebinds to None every default argument of a function of torch.distributed that is `group`. Some take
    `group=group.WORLD`, a default evaluated when their module is first imported (`torch.distributed.nn.functional`'s
    collectives, ZeroRedundancyOptimizer's helpers): imported after `init_process_group` (DDP's constructor imports
    `torch.distributed.nn` through `torch._dynamo`), they hold the default group for the interpreter's life, past
    `destroy_process_group`, with its gloo threads running until the interpreter's teardown frees it. None is what the
    default meant: the default group at the call."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("torch.distributed"):
            continue
        for value in list(vars(module).values()):
            # `type`, not `isinstance`: that reads `__class__`, which warns on torch's deprecated `reduce_op`.
            if type(value) is not types.FunctionType or value.__module__ != name:
                continue  # a function imported from another module is released there
            defaults = value.__defaults__
            if defaults and any(default is group for default in defaults):
                value.__defaults__ = tuple(None if default is group else default for default in defaults)
            keyword_defaults = value.__kwdefaults__
            if keyword_defaults and any(default is group for default in keyword_defaults.values()):
                value.__kwdefaults__ = {
                    key: None if default is group else default for key, default in keyword_defaults.items()
                }


__all__ = [
    "all_gather_rows",
    "all_gather_sizes",
    "balanced_ranges",
    "broadcast_object",
    "broadcast_through_file",
    "communication_device",
    "end_process_group",
    "gather_rows_to_cpu",
    "gather_rows_with_gradient",
    "reduce_scatter_rows",
]
