# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The loss seam: per-logit multi-label losses and the loss of one output layer without its logits.

A loss is one function `(logits, targets) -> (terms, grad)` over fp32 tensors of one shape: the loss
of each (example, label) pair and its derivative in the logit. `LOSSES` maps the names that
`HasteConfig.loss` accepts to them; adding a loss is one function and one entry.

`output_layer_loss` computes the loss of a dense (`[n, d]`) or group-sparse (`[K, G, F]` with
supports) output layer from its input, its parameters and the positive positions of each example,
never holding its `[B, n]` logits in fp32:
- on CUDA, through the fused `haste::linear_loss` op of `haste_hf.kernels.ops` when it is installed (the
  sparse tail's forward kernel computes the loss in its epilogue and writes the 16-bit logit
  gradient that the backward kernels read; the dense head runs cuBLAS then one fused kernel);
- everywhere else (CPU, exported remote code, shapes outside the kernels' fast path), in label
  chunks: the forward keeps only the loss, the backward recomputes each chunk's logits, so memory is
  `O(B * chunk)` whatever `n`;
- for a weight marked by `chunk_loss_backward_`, in label chunks on CUDA too (the fused op's forward
  stores nothing; the backward recomputes each chunk's logit gradient with it), optionally handing each
  chunk's weight gradient to an optimizer's update instead of returning a weight-sized gradient.

Flat and Hub-exportable: imports only torch and its sibling `sparse_ops`.
"""

import torch
import torch.nn.functional as F

from .sparse_ops import _KERNELS, _forward_reference, chunks


# Bounds the transient `[B, chunk]` logits (and the `[B, groups, F]` gathered features) of the chunked path.
_LOSS_CHUNK_ELEMENTS = 1 << 22
# Logit-gradient elements per chunk of `chunk_loss_backward_` when no label count is given: 256 MiB of bf16,
# 2^20 labels at batch 128, fewer over the global batch of a sharded layer (the transient stays the same).
DEFAULT_LOSS_CHUNK_ELEMENTS = 1 << 27


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


def _column_chunks(batch_size: int, weight: torch.Tensor, sparse: bool, chunk_labels: int | None = None):
    """Slices of output units (rows of a dense weight, groups of a sparse one) of bounded size: about
    `chunk_labels` outputs each when given (0: `DEFAULT_LOSS_CHUNK_ELEMENTS` logit-gradient elements), else
    a bounded number of transient elements of the PyTorch path."""
    units = weight.shape[0]
    if chunk_labels is not None:
        chunk_labels = chunk_labels or max(1, DEFAULT_LOSS_CHUNK_ELEMENTS // max(1, batch_size))
        return chunks(units, weight.shape[1] if sparse else 1, chunk_labels)
    # Per unit: G logits and F gathered features of a group, one logit of a dense row.
    width = max(weight.shape[1], weight.shape[2]) if sparse else 1
    return chunks(units, batch_size * width, _LOSS_CHUNK_ELEMENTS)


def _chunk_logits(x, weight, supports, bias, chunk: slice, columns: slice):
    if supports is None:
        logits = x @ weight[chunk].t()
    else:
        logits = _forward_reference(x, weight[chunk], supports[chunk])
    return logits if bias is None else logits + bias[columns]


def _chunk_logit_gradient(x, weight, bias, supports, positions, valid_count, scale, loss_name, chunk, columns, kernels):
    """`scale * dloss/dz` of the outputs `columns` (weight rows / groups `chunk`), `[B, columns]` in the
    layer's dtype, 0 at padding slots: recomputed from the layer's input and weights."""
    if kernels:
        return _KERNELS.linear_loss_gradient(
            x,
            weight[chunk],
            None if bias is None else bias[columns],
            None if supports is None else supports[chunk],
            positions - columns.start,
            min(max(0, valid_count - columns.start), columns.stop - columns.start),
            scale,
            loss_name,
        )
    accumulate = torch.promote_types(x.dtype, torch.float32)
    logits = _chunk_logits(x, weight, supports, bias, chunk, columns).to(accumulate)
    targets = targets_of_chunk(positions, columns.start, columns.stop, valid_count, accumulate)
    _, grad_logits = LOSSES[loss_name](logits, targets)
    grad_logits[:, max(0, valid_count - columns.start) :] = 0.0  # padding slots
    # Rounded to the layer's dtype, as the gradient of its logits would be.
    return (grad_logits * scale).to(weight.dtype)


class _ChunkedLinearLoss(torch.autograd.Function):
    """Loss of an output layer, label chunk by label chunk, recomputing each chunk's logits in backward.

    With `kernels`, the forward is the fused loss op storing nothing and each chunk's logit gradient comes
    from it too; with `update`, each chunk's weight gradient goes to `update(rows, grad)` instead of a
    weight-sized gradient (see `chunk_loss_backward_`)."""

    @staticmethod
    def forward(
        ctx, x, weight, bias, supports, positions, valid_count, scale, loss_name, chunk_labels, update, kernels
    ):
        ctx.save_for_backward(x, weight, bias, supports, positions)
        ctx.valid_count, ctx.scale, ctx.loss_name = valid_count, scale, loss_name
        ctx.chunk_labels, ctx.update, ctx.kernels = chunk_labels, update, kernels
        if kernels:  # grad mode is off here: the op stores no logit gradient
            return _KERNELS.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss_name)
        total = torch.zeros((), dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
        for chunk, columns in _chunks(x, weight, supports, chunk_labels):
            logits = _chunk_logits(x, weight, supports, bias, chunk, columns).to(total.dtype)
            targets = targets_of_chunk(positions, columns.start, columns.stop, valid_count, total.dtype)
            terms, _ = LOSSES[loss_name](logits, targets)
            total = total + terms[:, : max(0, min(columns.stop, valid_count) - columns.start)].sum()
        return total * scale

    @staticmethod
    def backward(ctx, grad_loss):
        x, weight, bias, supports, positions = ctx.saved_tensors
        sparse, kernels, update = supports is not None, ctx.kernels, ctx.update
        accumulate = torch.promote_types(x.dtype, torch.float32)
        grad_x = torch.zeros(x.shape, dtype=accumulate, device=x.device) if ctx.needs_input_grad[0] else None
        grad_weight = torch.empty_like(weight) if ctx.needs_input_grad[1] and update is None else None
        grad_bias = torch.empty_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        # The upstream factor (1 for `loss.backward()`) scales the small operands: `x` and the `[B, d]` result.
        scaled_x = x * grad_loss.to(x.dtype)
        for chunk, columns in _chunks(x, weight, supports, ctx.chunk_labels):
            with torch.no_grad():
                grad_logits = _chunk_logit_gradient(
                    x,
                    weight,
                    bias,
                    supports,
                    positions,
                    ctx.valid_count,
                    ctx.scale,
                    ctx.loss_name,
                    chunk,
                    columns,
                    kernels,
                )
            if grad_bias is not None:
                grad_bias[columns] = (grad_logits.sum(0, dtype=accumulate) * grad_loss).to(bias.dtype)
            # The feature gradient first: it reads the weights of this chunk that `update` is about to change.
            if grad_x is not None:
                if not sparse:
                    grad_x += grad_logits @ weight[chunk]
                elif kernels:
                    grad_x += _KERNELS.group_sparse_grad_input(grad_logits, weight[chunk], supports[chunk], x.shape[1])
                else:
                    batch_size, groups = x.shape[0], chunk.stop - chunk.start
                    grad_gathered = torch.einsum(
                        "bkg,kgf->bkf", grad_logits.view(batch_size, groups, -1), weight[chunk]
                    )
                    grad_x.index_add_(
                        1, supports[chunk].reshape(-1).long(), grad_gathered.reshape(batch_size, -1).to(accumulate)
                    )
            if not ctx.needs_input_grad[1]:
                continue
            if not sparse:
                chunk_grad = grad_logits.t() @ scaled_x
            elif kernels:
                chunk_grad = _KERNELS.group_sparse_grad_weight(grad_logits, scaled_x, supports[chunk], weight.shape[1])
            else:
                grad_logits = grad_logits.view(x.shape[0], chunk.stop - chunk.start, weight.shape[1])
                chunk_grad = torch.einsum("bkg,bkf->kgf", grad_logits, scaled_x[:, supports[chunk].long()])
            if update is not None:
                update(chunk, chunk_grad)
            else:
                grad_weight[chunk] = chunk_grad
        if grad_x is not None:
            grad_x = (grad_x * grad_loss).to(x.dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None, None, None, None


def _chunks(x, weight, supports, chunk_labels=None):
    """(unit slice, output-column slice) pairs covering the layer."""
    units_per_chunk = 1 if supports is None else weight.shape[1]
    for chunk in _column_chunks(x.shape[0], weight, supports is not None, chunk_labels):
        yield chunk, slice(chunk.start * units_per_chunk, chunk.stop * units_per_chunk)


class _ChunkedBackward:
    """The way `output_layer_loss` runs the backward of one weight (set by `chunk_loss_backward_`)."""

    def __init__(self, chunk_labels: int, update):
        self.chunk_labels, self.update = chunk_labels, update


def chunk_loss_backward_(weight: torch.Tensor, chunk_labels: int | None = 0, update=None) -> None:
    """Makes `output_layer_loss` of the layer owning `weight` (a dense `[n, d]` or group-sparse `[K, G, F]`
    parameter) run its backward `chunk_labels` outputs at a time (0: as many as make
    `DEFAULT_LOSS_CHUNK_ELEMENTS` logit-gradient elements at the batch size), recomputing each chunk's logits
    from the saved input and weights (the fused kernels' forward once more on CUDA): no `[B, n]` logit
    gradient is ever stored, the transient is `O(B * chunk_labels)` whatever `n`. `chunk_labels=None` undoes it.

    `update`, if given, is called as `update(rows, grad)` with each chunk's weight gradient (`weight[rows]`'s
    shape) once the chunk's feature gradient has read its weights, and no weight gradient is returned:
    an optimizer's step fused into the backward (`StochasticRoundingSGD.update_rows_`), so no weight-sized
    gradient exists either. Then `weight.grad` stays None, gradient accumulation and clipping of `weight`
    cannot work, and the update happens in `loss.backward()`.
    """
    if chunk_labels is None:
        weight.__dict__.pop("_haste_chunked_backward", None)
        return
    if not isinstance(chunk_labels, int) or chunk_labels < 0:
        raise ValueError(
            f"`chunk_labels` must be a number of outputs (0: chosen by the batch size), got {chunk_labels!r}."
        )
    weight._haste_chunked_backward = _ChunkedBackward(chunk_labels, update)


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
        raise ValueError(
            f"`positions` must be [batch, positives] with {x.shape[0]} rows, got {tuple(positions.shape)}."
        )
    # The layer computes in its own dtype, also under autocast (as `HasteTrainer` trains a bf16 output layer).
    with torch.autocast(x.device.type, enabled=False):
        kernels = (
            x.is_cuda and _KERNELS is not None and _KERNELS.is_available() and _KERNELS.fuses_loss(x, weight, supports)
        )
        chunked = getattr(weight, "_haste_chunked_backward", None)
        if chunked is not None and torch.is_grad_enabled():
            return _ChunkedLinearLoss.apply(
                x,
                weight,
                bias,
                supports,
                positions,
                valid_count,
                scale,
                loss,
                chunked.chunk_labels,
                chunked.update,
                kernels,
            )
        if kernels:
            return _KERNELS.linear_loss(x, weight, bias, supports, positions, valid_count, scale, loss)
        return _ChunkedLinearLoss.apply(
            x, weight, bias, supports, positions, valid_count, scale, loss, None, None, False
        )


__all__ = [
    "DEFAULT_LOSS_CHUNK_ELEMENTS",
    "LOSSES",
    "bce",
    "chunk_loss_backward_",
    "output_layer_loss",
    "squared_hinge",
    "targets_of_chunk",
]
