# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The loss seam: per-logit multi-label losses and the loss of one output layer without its logits.

A loss is one function `(logits, targets) -> (terms, grad)` over fp32 tensors of one shape: the loss
of each (example, label) pair and its derivative in the logit. `LOSSES` maps the names that
`HasteConfig.loss` accepts to them; adding a loss is one function and one entry.

`output_layer_loss` computes the loss of a dense (`[n, d]`) or group-sparse (`[K, G, F]` with
supports) output layer from its input, its parameters and the positive positions of each example,
never holding its `[B, n]` logits in fp32:
- on CUDA, through the fused `haste::linear_loss` op of `haste_hf.kernels` when it is installed (the
  sparse tail's forward kernel computes the loss in its epilogue and writes the 16-bit logit
  gradient that the backward kernels read; the dense head runs cuBLAS then one fused kernel);
- everywhere else (CPU, exported remote code, shapes outside the kernels' fast path), in label
  chunks: the forward keeps only the loss, the backward recomputes each chunk's logits, so memory is
  `O(B * chunk)` whatever `n`.

Flat and Hub-exportable: imports only torch and its sibling `sparse_ops`.
"""

import torch
import torch.nn.functional as F

from .sparse_ops import _KERNELS, _forward_reference, chunks


# Bounds the transient `[B, chunk]` logits (and the `[B, groups, F]` gathered features) of the chunked path.
_LOSS_CHUNK_ELEMENTS = 1 << 22


def bce(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Binary cross-entropy with logits: softplus(z) - y z, and its derivative sigmoid(z) - y."""
    return F.softplus(logits) - targets * logits, torch.sigmoid(logits) - targets


def squared_hinge(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Squared hinge on signs s = 2y - 1: max(0, 1 - s z)^2, and its derivative -2 s max(0, 1 - s z)."""
    signs = 2.0 * targets - 1.0
    margins = torch.relu(1.0 - signs * logits)
    return margins.square(), -2.0 * signs * margins


LOSSES = {"bce": bce, "squared_hinge": squared_hinge}


def targets_of_chunk(positions: torch.Tensor, start: int, stop: int, valid_count: int, dtype) -> torch.Tensor:
    """`[B, stop - start]` 0/1 targets of output columns `[start, stop)` from positive positions `[B, P]`.

    Positions outside `[0, valid_count)` (padding -1, padding slots, another layer's labels) are not
    positives; a position listed twice is one positive.
    """
    stop_valid = min(stop, valid_count)
    inside = (positions >= start) & (positions < stop_valid)
    columns = torch.where(inside, positions - start, 0)
    targets = torch.zeros(positions.shape[0], stop - start, dtype=dtype, device=positions.device)
    return targets.scatter_reduce_(1, columns, inside.to(dtype), reduce="amax")


def _column_chunks(batch_size: int, weight: torch.Tensor, sparse: bool):
    """Slices of output units (rows of a dense weight, groups of a sparse one) of bounded size."""
    units = weight.shape[0]
    # Per unit: G logits and F gathered features of a group, one logit of a dense row.
    width = max(weight.shape[1], weight.shape[2]) if sparse else 1
    return chunks(units, batch_size * width, _LOSS_CHUNK_ELEMENTS)


def _chunk_logits(x, weight, supports, bias, chunk: slice, columns: slice):
    if supports is None:
        logits = x @ weight[chunk].t()
    else:
        logits = _forward_reference(x, weight[chunk], supports[chunk])
    return logits if bias is None else logits + bias[columns]


class _ChunkedLinearLoss(torch.autograd.Function):
    """Loss of an output layer, label chunk by label chunk, recomputing each chunk's logits in backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, supports, positions, valid_count, scale, loss_name):
        ctx.save_for_backward(x, weight, bias, supports, positions)
        ctx.valid_count, ctx.scale, ctx.loss_name = valid_count, scale, loss_name
        total = torch.zeros((), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        for chunk, columns in _chunks(x, weight, supports):
            logits = _chunk_logits(x, weight, supports, bias, chunk, columns).to(total.dtype)
            targets = targets_of_chunk(positions, columns.start, columns.stop, valid_count, total.dtype)
            terms, _ = LOSSES[loss_name](logits, targets)
            total = total + terms[:, : max(0, min(columns.stop, valid_count) - columns.start)].sum()
        return total * scale

    @staticmethod
    def backward(ctx, grad_loss):
        x, weight, bias, supports, positions = ctx.saved_tensors
        sparse = supports is not None
        accumulate = torch.promote_types(x.dtype, torch.float32)
        grad_x = torch.zeros(x.shape, dtype=accumulate, device=x.device) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = torch.empty_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        for chunk, columns in _chunks(x, weight, supports):
            with torch.no_grad():
                logits = _chunk_logits(x, weight, supports, bias, chunk, columns).to(accumulate)
            targets = targets_of_chunk(positions, columns.start, columns.stop, ctx.valid_count, accumulate)
            _, grad_logits = LOSSES[ctx.loss_name](logits, targets)
            grad_logits[:, max(0, ctx.valid_count - columns.start) :] = 0.0  # padding slots
            # Rounded to the layer's dtype, as the gradient of its logits would be, then scaled.
            grad_logits = (grad_logits * (grad_loss * ctx.scale)).to(weight.dtype)
            if grad_bias is not None:
                grad_bias[columns] = grad_logits.sum(0, dtype=accumulate).to(bias.dtype)
            if not sparse:
                if grad_weight is not None:
                    grad_weight[chunk] = grad_logits.t() @ x
                if grad_x is not None:
                    grad_x += grad_logits @ weight[chunk]
                continue
            batch_size, groups = x.shape[0], chunk.stop - chunk.start
            grad_logits = grad_logits.view(batch_size, groups, weight.shape[1])
            chunk_supports = supports[chunk].long()
            if grad_weight is not None:
                grad_weight[chunk] = torch.einsum("bkg,bkf->kgf", grad_logits, x[:, chunk_supports])
            if grad_x is not None:
                grad_gathered = torch.einsum("bkg,kgf->bkf", grad_logits, weight[chunk])
                grad_x.index_add_(1, chunk_supports.reshape(-1), grad_gathered.reshape(batch_size, -1).to(accumulate))
        if grad_x is not None:
            grad_x = grad_x.to(x.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


def _chunks(x, weight, supports):
    """(unit slice, output-column slice) pairs covering the layer."""
    units_per_chunk = 1 if supports is None else weight.shape[1]
    for chunk in _column_chunks(x.shape[0], weight, supports is not None):
        yield chunk, slice(chunk.start * units_per_chunk, chunk.stop * units_per_chunk)


def output_layer_loss(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    positions: torch.Tensor,
    valid_count: int,
    scale: float,
    loss: str = "bce",
    supports: torch.Tensor | None = None,
) -> torch.Tensor:
    """`scale` times the loss summed over the first `valid_count` outputs of one layer, an fp32 scalar.

    Args:
        x: the layer's input `[B, d]`, in the weight's dtype.
        weight: dense `[n, d]`, or group-sparse `[K, G, F]` with `supports` (then n = K * G).
        bias: optional `[n]`.
        positions: int64 `[B, P]`, each example's positive output columns of this layer (unsorted, repeats
            allowed); entries outside `[0, valid_count)` are ignored (-1 padding, the columns of other layers
            or shards), so a slice of a layer takes positions relative to its first column.
        valid_count: outputs `[0, valid_count)` count; later ones (padding slots of the last group) do not.
        scale: factor of the sum (1 / B for the `sum` reduction, 1 / (B * L) for `mean`).
        loss: a name of `LOSSES`.
        supports: int32 `[K, F]` for a group-sparse weight, else None.
    """
    if loss not in LOSSES:
        raise ValueError(f"`loss` must be one of {sorted(LOSSES)}, got {loss!r}.")
    if positions.dim() != 2 or positions.shape[0] != x.shape[0]:
        raise ValueError(f"`positions` must be [batch, positives] with {x.shape[0]} rows, got {tuple(positions.shape)}.")
    # The layer computes in its own dtype, also under autocast (as `HasteTrainer` trains a bf16 output layer).
    with torch.autocast(x.device.type, enabled=False):
        if x.is_cuda and _KERNELS is not None and _KERNELS.is_available() and _KERNELS.fuses_loss(x, weight, supports):
            return _KERNELS.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss)
        return _ChunkedLinearLoss.apply(x, weight, bias, supports, positions, valid_count, scale, loss)


__all__ = ["LOSSES", "bce", "output_layer_loss", "squared_hinge", "targets_of_chunk"]
