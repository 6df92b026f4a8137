# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The fused top-k of the tail (`haste::group_sparse_topk`): the `k` best fp32 scores of each row of its logits
among columns `[0, valid_count)` and their columns, without the `[B, K * G]` logits.

The forward's main loop (`forward.group_logits`) with a ranking epilogue: each program keeps, per row of its
batch tile, a list of its `KP >= k` best (score, column) in registers, packed in one int64 key (an
order-preserving int32 of the score above the column), so one max is a score and its column. A group's logits
that do not beat a row's lowest listed key cost one compare; the others enter one per round (a while loop that
runs only while some row of the tile still has a better candidate). The lists `[B, programs * KP]` are merged by
`torch.topk`. Scores are the logits rounded to the layer's dtype (as the logits kernel stores them); a row with
fewer than k scored columns ends in (-inf, -1).
"""

import contextlib

import torch
import triton
import triton.language as tl

from .forward import LaunchConfig, group_logits, pack_columns, transposed_padded


@triton.jit
def _ordered_key(scores):
    """int32 keys that order as the fp32 scores do (the bits of a negative float, its lower 31 flipped)."""
    bits = scores.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _topk_kernel(
    xt_ptr,
    weight_ptr,
    supports_ptr,
    bias_ptr,
    scores_ptr,
    ids_ptr,
    B,
    Bp,
    K,
    packs,
    packs_per_program,
    valid_count,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PACK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    KP: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
):
    tile_rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    slots = tl.arange(0, KP)
    first = tl.program_id(1) * packs_per_program
    # Empty slots: the key of -inf above the slot's index (distinct keys, below every real score); a discarded
    # candidate: below them all.
    empty = _ordered_key(tl.full((), float("-inf"), tl.float32)).to(tl.int64) << 32
    floor = empty - 1
    best = tl.zeros((BLOCK_B, KP), dtype=tl.int64) + (empty + slots)[None, :]
    bar = tl.min(best, axis=1)
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
        z = logits.to(OUT_DTYPE).to(tl.float32)
        columns, exists = pack_columns(pack, K, G, BLOCK_G, PACK)
        scored = (tile_rows[:, None] < B) & (exists & (columns < valid_count))[None, :] & (first + step < packs)
        keys = (_ordered_key(z).to(tl.int64) << 32) + columns[None, :]
        candidates = tl.where(scored, keys, floor)
        top = tl.max(candidates, axis=1)
        entering = top > bar
        while tl.max(entering.to(tl.int32), axis=0) > 0:
            best = tl.where(entering[:, None] & (best == bar[:, None]), top[:, None], best)
            candidates = tl.where(candidates == top[:, None], floor, candidates)
            bar = tl.min(best, axis=1)
            top = tl.max(candidates, axis=1)
            entering = top > bar
    high = (best >> 32).to(tl.int32)
    scores = (high ^ ((high >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    ids = tl.where(best >= (empty + KP), best & 0xFFFFFFFF, -1)
    lists = tl.num_programs(1) * KP
    at = tile_rows.to(tl.int64)[:, None] * lists + tl.program_id(1) * KP + slots[None, :]
    in_batch = (tile_rows < B)[:, None]
    tl.store(scores_ptr + at, scores, mask=in_batch)
    tl.store(ids_ptr + at, ids, mask=in_batch)


_TRITON_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def group_sparse_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    bias: torch.Tensor | None,
    k: int,
    valid_count: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 scores `[B, k]`, int64 columns `[B, k]`), best first."""
    batch = x.shape[0]
    num_groups, group_size, fan_in = weight.shape
    if num_groups * group_size >= 2**31:
        raise ValueError(f"the fused top-k takes fewer than 2**31 outputs, got {num_groups * group_size}.")
    if batch == 0 or num_groups * group_size == 0 or fan_in == 0:
        scores = x.new_full((batch, k), float("-inf"), dtype=torch.float32)
        return scores, x.new_full((batch, k), -1, dtype=torch.int64)
    config = LaunchConfig(batch, num_groups, group_size, fan_in, x.dtype, x.device)
    list_size = max(2, triton.next_power_of_2(k))
    if list_size > 32:  # the [BLOCK_B, KP] lists live in registers
        config.block_b = min(config.block_b, 32)
    xt = transposed_padded(x, config.padded_batch)
    lists = config.runs * list_size
    scores = torch.empty(batch, lists, dtype=torch.float32, device=x.device)
    ids = torch.empty(batch, lists, dtype=torch.int64, device=x.device)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _topk_kernel[config.grid](
            xt,
            weight,
            supports,
            bias.contiguous() if bias is not None else weight,
            scores,
            ids,
            batch,
            config.padded_batch,
            num_groups,
            config.packs,
            config.packs_per_program,
            valid_count,
            G=group_size,
            F=fan_in,
            HAS_BIAS=bias is not None,
            KP=list_size,
            OUT_DTYPE=_TRITON_DTYPES[x.dtype],
            **config.launch_options(),
        )
    scores, best = scores.topk(k, dim=1)
    return scores, ids.gather(1, best)


__all__ = ["group_sparse_topk"]
