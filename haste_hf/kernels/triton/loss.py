# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The fused loss of an output layer (`haste::linear_loss`): BCE or squared hinge over its first `valid_count`
outputs, summed reproducibly, and `scale * dloss/dz` in the layer's dtype for the backward (0 at the padding
slots), or nothing when no gradient is needed.

- group-sparse tail: the forward's main loop (`forward.group_logits`) with the loss as its epilogue, so its
  `[B, K * G]` logits never reach memory;
- dense head (or any logits): one elementwise pass over cuBLAS's logits that overwrites them with their gradient
  (`logits_loss.py`).

The positives come as per-row positions `[B, P]` (any order, repeats, -1 padding, columns past the layer);
`positive_mask.py` turns them into a bit mask `[B, ceil(n / 32)]` that the epilogues read. Each program sums its loss
terms in a fixed order (each tile element over the program's groups in fp32, then across the tile in fp64) into
its own slot; the slots are added by PyTorch, so the loss is the same bits run to run. The loss is computed on each logit rounded to the layer's dtype, as the
logits kernel would have stored it.
"""

import torch
import triton
import triton.language as tl

from .forward import LaunchConfig, group_logits, pack_columns
from .logits_loss import logits_loss_
from .loss_terms import fast_log, loss_and_gradient
from .positive_mask import positive_mask


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
    FAST_LOG: tl.constexpr,
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
        loss, gradient = loss_and_gradient(z, y, LOSS, FAST_LOG)
        counted = in_tile & (columns < valid_count)[None, :]
        terms += tl.where(counted, loss, 0.0)
        if STORE:
            stored = tl.where(counted, gradient * scale, 0.0).to(grad_ptr.dtype.element_ty)
            tl.store(grad_ptr + rows64[:, None] * L + columns[None, :], stored, mask=in_tile)
    total = tl.sum(tl.sum(terms, axis=1).to(tl.float64), axis=0)
    tl.store(partials_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), total)


def _words_per_pack(group_size: int, config) -> int:
    """Mask words a pack's columns cover when they are whole words or lie inside one (then the epilogue loads one
    word per row and word); 0 otherwise (one load per logit)."""
    columns = config.pack * group_size
    if group_size != config.block_g or (columns % 32 and 32 % columns):
        return 0
    return max(1, columns // 32)


def loss_tile(config: LaunchConfig) -> int:
    """Fits the forward's tile `config` to the loss's epilogue and returns the warps a program takes: 2048 logits a
    tile (64 rows x 32 labels, 32 x 64, 128 x 16; no more rows than the forward takes), 4 warps, 2 pipeline stages.
    On an H200 (`benchmarks/results/triton_notes.md`, v4) 8 warps or 128 x 32 tiles were 4-30% slower, 64 x 64 tiles
    use 255 registers a thread (ptxas, sm_90), 32 x 64 tiles 168; the third stage took F = 32, G = 32 from 128 to 182
    registers and 1.0-1.1x the CUDA build's time to 1.5x (2 stages: within 5% of 3 elsewhere)."""
    config.block_b = max(16, min(config.block_b, 2048 // (config.pack * config.block_g)))
    config.num_stages = 2
    return config.num_warps


def sparse_loss(x, weight, supports, bias, mask, valid_count: int, scale: float, loss_kind: int, store: bool):
    """(loss, logit gradient `[B, K * G]` or `[0, K * G]` without `store`) of a group-sparse layer, its logits
    never stored."""
    batch = x.shape[0]
    num_groups, group_size, fan_in = weight.shape
    grad = x.new_empty(batch if store else 0, num_groups * group_size)
    config = LaunchConfig(batch, num_groups, group_size, fan_in, x.dtype, x.device)
    warps = loss_tile(config)
    partials = torch.empty(config.batch_tiles * config.runs, dtype=torch.float64, device=x.device)
    config.launch(
        _sparse_loss_kernel,
        x,
        weight,
        supports,
        bias,
        outputs=(mask, grad if store else x, partials),
        scalars=(mask.shape[1], valid_count, scale),
        num_warps=warps,
        LOSS=loss_kind,
        STORE=store,
        WORDS_PER_PACK=_words_per_pack(group_size, config),
        FAST_LOG=fast_log(x),
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
    loss_kind: int,
    store_gradient: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`haste::linear_loss` (its arguments checked by `haste_hf.kernels.ops`): (`scale` times the loss, `loss_kind`
    0 BCE or 1 squared hinge, over outputs `[0, valid_count)`, fp32 scalar; the logit gradient `[B, n]` in x's dtype,
    or `[0, n]` without `store_gradient`) of a dense `[n, d]` layer or a group-sparse `[K, G, F]` one with int32
    `supports` (any G, F: the fused epilogue masks the padding)."""
    batch = x.shape[0]
    sparse = supports is not None
    n = weight.shape[0] * weight.shape[1] if sparse else weight.shape[0]
    if batch == 0 or n == 0:
        return x.new_zeros((), dtype=torch.float32), x.new_zeros(batch if store_gradient else 0, n)
    mask = positive_mask(positions, n, valid_count)
    if sparse:
        return sparse_loss(x, weight, supports, bias, mask, valid_count, scale, loss_kind, store_gradient)
    logits = (torch.addmm(bias, x, weight.t()) if bias is not None else x @ weight.t()).contiguous()
    value = logits_loss_(logits, mask, valid_count, scale, loss_kind, store_gradient)
    return value, logits if store_gradient else x.new_empty(0, n)


__all__ = ["linear_loss", "loss_tile", "sparse_loss"]
