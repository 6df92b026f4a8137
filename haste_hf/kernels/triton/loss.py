# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The fused loss of an output layer (`haste::linear_loss`): BCE or squared hinge over its first `valid_count`
outputs, summed reproducibly, and `scale * dloss/dz` in the layer's dtype for the backward (0 at the padding
slots), or nothing when no gradient is needed.

- group-sparse tail: the forward's main loop (`forward.group_logits`) with the loss as its epilogue, so its
  `[B, K * G]` logits never reach memory;
- dense head (or any logits): one elementwise pass over cuBLAS's logits that overwrites them with their gradient.

The positives come as per-row positions `[B, P]` (any order, repeats, -1 padding, columns past the layer); one
small kernel turns them into a bit mask `[B, ceil(n / 32)]` that the epilogues read. Each program sums its loss
terms in a fixed order (each tile element over the program's groups in fp32, then across the tile in fp64) into
its own slot; the slots are added by PyTorch, so
the loss is the same bits run to run. The loss is computed on each logit rounded to the layer's dtype, as the
logits kernel would have stored it.
"""

import contextlib

import torch
import triton
import triton.language as tl

from .forward import LaunchConfig, group_logits, pack_columns, transposed_padded


LOSS_KINDS = {"bce": 0, "squared_hinge": 1}
_MASK_BLOCK = 1024
_ELEMENTWISE_BLOCK = 2048


@triton.jit
def loss_and_gradient(z, y, LOSS: tl.constexpr):
    """Loss of logits z against 0/1 targets y and its derivative in z (fp32, elementwise)."""
    if LOSS == 0:
        # softplus(z) - y z and sigmoid(z) - y from e = exp(-|z|) in (0, 1]: no overflow at any z. log1p(e) by its
        # series below 1/16 (relative error < e^5 / 6), else log(1 + e) (absolute error ~1e-7 on a value >= 0.06).
        e = tl.exp(-tl.abs(z))
        series = e * (1.0 - e * (0.5 - e * (1.0 / 3.0 - e * (0.25 - e * 0.2))))
        log1p_e = tl.where(e < 0.0625, series, tl.log(1.0 + e))
        inverse = 1.0 / (1.0 + e)
        loss = tl.maximum(z, 0.0) + log1p_e - y * z
        gradient = tl.where(z >= 0.0, inverse, e * inverse) - y
    else:
        sign = 2.0 * y - 1.0
        margin = tl.maximum(1.0 - sign * z, 0.0)
        loss = margin * margin
        gradient = -2.0 * sign * margin
    return loss, gradient


@triton.jit
def _positive_mask_kernel(positions_ptr, count, P, valid_count, mask_ptr, words, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    position = tl.load(positions_ptr + index, mask=index < count, other=-1)
    inside = (index < count) & (position >= 0) & (position < valid_count)
    row = index // P
    bit = (1 << (position % 32)).to(tl.int32)
    tl.atomic_or(mask_ptr + row * words + position // 32, bit, mask=inside)


@triton.jit
def _sparse_loss_kernel(
    xt_ptr,
    weight_ptr,
    supports_ptr,
    bias_ptr,
    mask_ptr,
    grad_ptr,
    partials_ptr,
    B,
    Bp,
    K,
    packs,
    packs_per_program,
    words,
    valid_count,
    scale,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PACK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    LOSS: tl.constexpr,
    STORE: tl.constexpr,
    WORDS_PER_PACK: tl.constexpr,
):
    tile_rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    first = tl.program_id(1) * packs_per_program
    L = (tl.zeros((), dtype=tl.int64) + K) * G  # K may arrive as the constant 1 (Triton specializes it)
    rows64 = tl.minimum(tile_rows, B - 1).to(tl.int64)
    in_batch = tile_rows[:, None] < B
    # Each element of the tile sums its own terms over the run (fp32, a fixed order); one reduction at the end.
    terms = tl.zeros((BLOCK_B, PACK * BLOCK_G), dtype=tl.float32)
    # A fixed trip count, as in forward.py: packs past the end recompute the last one and count nothing.
    for step in range(packs_per_program):
        pack = tl.minimum(first + step, packs - 1)
        logits = group_logits(
            xt_ptr,
            weight_ptr,
            supports_ptr,
            bias_ptr,
            pack,
            K,
            tile_rows,
            Bp,
            G,
            F,
            BLOCK_G,
            BLOCK_F,
            PACK,
            HAS_BIAS,
            IEEE,
        )
        z = logits.to(grad_ptr.dtype.element_ty).to(tl.float32)
        columns, exists = pack_columns(pack, K, G, BLOCK_G, PACK)
        in_tile = in_batch & exists[None, :] & (first + step < packs)
        if WORDS_PER_PACK > 0:
            # The pack's columns are whole 32-bit words of the mask (or lie in one): a load per row and word, not per
            # logit (a [BLOCK_B, PACK * G] tensor of 64-bit addresses costs the registers the epilogue needs).
            first_column = pack.to(tl.int64) * (PACK * G)
            word0 = first_column // 32
            bit = (first_column % 32).to(tl.int32) + tl.arange(0, PACK * BLOCK_G)
            word = tl.zeros((BLOCK_B, PACK * BLOCK_G), dtype=tl.int32)
            for i in tl.static_range(WORDS_PER_PACK):
                row_word = tl.load(mask_ptr + rows64 * words + word0 + i, mask=(word0 + i < words), other=0)
                word = tl.where((bit // 32 == i)[None, :], row_word[:, None], word)
            y = ((word >> (bit % 32)[None, :]) & 1).to(tl.float32)
        else:
            word = tl.load(mask_ptr + rows64[:, None] * words + (columns // 32)[None, :], mask=in_tile, other=0)
            y = ((word >> (columns % 32).to(tl.int32)[None, :]) & 1).to(tl.float32)
        loss, gradient = loss_and_gradient(z, y, LOSS)
        counted = in_tile & (columns < valid_count)[None, :]
        terms += tl.where(counted, loss, 0.0)
        if STORE:
            stored = tl.where(counted, gradient * scale, 0.0).to(grad_ptr.dtype.element_ty)
            tl.store(grad_ptr + rows64[:, None] * L + columns[None, :], stored, mask=in_tile)
    total = tl.sum(tl.sum(terms, axis=1).to(tl.float64), axis=0)
    tl.store(partials_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), total)


@triton.jit
def _logits_loss_kernel(
    logits_ptr,
    mask_ptr,
    partials_ptr,
    n,
    blocks_per_row,
    words,
    valid_count,
    scale,
    LOSS: tl.constexpr,
    STORE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0)
    row = (program // blocks_per_row).to(tl.int64)
    columns = (program % blocks_per_row).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = columns < n
    at = logits_ptr + row * n + columns
    z = tl.load(at, mask=inside, other=0.0).to(tl.float32)
    word = tl.load(mask_ptr + row * words + columns // 32, mask=inside, other=0)
    y = ((word >> (columns % 32).to(tl.int32)) & 1).to(tl.float32)
    loss, gradient = loss_and_gradient(z, y, LOSS)
    counted = inside & (columns < valid_count)
    tl.store(partials_ptr + program, tl.sum(tl.where(counted, loss, 0.0), axis=0).to(tl.float64))
    if STORE:
        tl.store(at, tl.where(counted, gradient * scale, 0.0).to(logits_ptr.dtype.element_ty), mask=inside)


def _device(tensor):
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def positive_mask(positions: torch.Tensor, outputs: int, valid_count: int) -> torch.Tensor:
    """Bits `[B, ceil(outputs / 32)]` int32 (bit c of word w: column 32 w + c) of the positions in `[0, valid_count)`."""
    batch = positions.shape[0]
    words = triton.cdiv(max(outputs, 1), 32)
    mask = torch.zeros(batch, words, dtype=torch.int32, device=positions.device)
    positions = positions.to(torch.int64).contiguous()
    count = positions.numel()
    if count > 0:
        with _device(positions):
            _positive_mask_kernel[(triton.cdiv(count, _MASK_BLOCK),)](
                positions, count, positions.shape[1], valid_count, mask, words, BLOCK=_MASK_BLOCK
            )
    return mask


def logits_loss_(logits: torch.Tensor, mask: torch.Tensor, valid_count: int, scale: float, loss: str, store: bool):
    """The loss of materialised logits `[B, n]` (fp32 scalar, times `scale`); with `store` the logits are
    overwritten by `scale * dloss/dz` (0 at columns >= valid_count)."""
    batch, n = logits.shape
    blocks_per_row = triton.cdiv(n, _ELEMENTWISE_BLOCK)
    partials = torch.empty(batch * blocks_per_row, dtype=torch.float64, device=logits.device)
    with _device(logits):
        _logits_loss_kernel[(batch * blocks_per_row,)](
            logits,
            mask,
            partials,
            n,
            blocks_per_row,
            mask.shape[1],
            valid_count,
            scale,
            LOSS=LOSS_KINDS[loss],
            STORE=store,
            BLOCK=_ELEMENTWISE_BLOCK,
            num_warps=8,
        )
    return (partials.sum() * scale).float()


def _words_per_pack(group_size: int, config) -> int:
    """Mask words a pack's columns cover when they are whole words or lie inside one (then the epilogue loads one
    word per row and word); 0 otherwise (one load per logit)."""
    columns = config.pack * group_size
    if group_size != config.block_g or (columns % 32 and 32 % columns):
        return 0
    return max(1, columns // 32)


def sparse_loss(x, weight, supports, bias, mask, valid_count: int, scale: float, loss: str, store: bool):
    """(loss, logit gradient `[B, K * G]` or `[0, K * G]` without `store`) of a group-sparse layer, its logits
    never stored."""
    batch = x.shape[0]
    num_groups, group_size, fan_in = weight.shape
    grad = x.new_empty(batch if store else 0, num_groups * group_size)
    config = LaunchConfig(batch, num_groups, group_size, fan_in, x.dtype, x.device)
    # The epilogue's registers: tiles above 128 rows x 32 labels spill (ptxas, sm_90, 128 x 64 even at 8 warps).
    if config.block_b * config.pack * config.block_g > 128 * 32:
        config.block_b = 64
    xt = transposed_padded(x, config.padded_batch)
    partials = torch.empty(config.batch_tiles * config.runs, dtype=torch.float64, device=x.device)
    with _device(x):
        _sparse_loss_kernel[config.grid](
            xt,
            weight,
            supports,
            bias.contiguous() if bias is not None else weight,
            mask,
            grad if store else x,
            partials,
            batch,
            config.padded_batch,
            num_groups,
            config.packs,
            config.packs_per_program,
            mask.shape[1],
            valid_count,
            scale,
            G=group_size,
            F=fan_in,
            HAS_BIAS=bias is not None,
            LOSS=LOSS_KINDS[loss],
            STORE=store,
            WORDS_PER_PACK=_words_per_pack(group_size, config),
            **config.launch_options(num_warps=config.epilogue_warps),
        )
    return (partials.sum() * scale).float(), grad


def linear_loss(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    supports: torch.Tensor | None,
    positions: torch.Tensor,
    valid_count: int,
    scale: float,
    loss: str,
    store_gradient: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`haste::linear_loss`: (`scale` times the loss over outputs `[0, valid_count)`, fp32 scalar; the logit
    gradient `[B, n]` in x's dtype, or `[0, n]` without `store_gradient`) of a dense `[n, d]` layer or a
    group-sparse `[K, G, F]` one with int32 `supports` (any G, F: the fused epilogue masks the padding)."""
    batch = x.shape[0]
    sparse = supports is not None
    n = weight.shape[0] * weight.shape[1] if sparse else weight.shape[0]
    if not 0 <= valid_count <= n:
        raise ValueError(f"`valid_count` must lie in [0, {n}], got {valid_count}.")
    if batch == 0 or n == 0:
        return x.new_zeros((), dtype=torch.float32), x.new_zeros(batch if store_gradient else 0, n)
    mask = positive_mask(positions, n, valid_count)
    if sparse:
        return sparse_loss(x, weight, supports, bias, mask, valid_count, scale, loss, store_gradient)
    logits = (torch.addmm(bias, x, weight.t()) if bias is not None else x @ weight.t()).contiguous()
    value = logits_loss_(logits, mask, valid_count, scale, loss, store_gradient)
    return value, logits if store_gradient else x.new_empty(0, n)


__all__ = ["LOSS_KINDS", "linear_loss", "logits_loss_", "loss_and_gradient", "positive_mask", "sparse_loss"]
