# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The feature gradient of the group-sparse tail in Triton: `grad_x[:, supports[k]] += grad_out_k @ weight[k]`.

The work is split over (batch tile, run of groups): a program computes, per group of its run, the
`[F, BLOCK_B]` product `weight_k^T @ grad_out_k^T` on tensor cores (fp32 accumulation) and adds it into
the rows `supports[k]` of an fp32 accumulator `grad_x^T [d, B]`, where the batch is contiguous so each
feature's update is one run of `BLOCK_B` floats. What costs is that addition: `B * K * F` fp32 updates
at addresses chosen by the data (the products are small); Triton has no scatter into shared memory, so
the accumulator lives in global memory, small enough (`d * B * 4` bytes, or that per split) to stay in
the L2 cache.

- fast mode: all programs add into one `[d, B]` buffer with fp32 atomics (relaxed, 16 bytes each: 4 batch
  rows); the order of the additions varies from run to run. Triton's software pipeline keeps the next
  groups' operands in flight. `pack` groups can share one dot (their weights on the diagonal blocks of one
  operand, as in the forward): fewer, larger loop steps for small F and G.
- deterministic mode (no float atomics): each program owns a partial `[d, BLOCK_B]` of a `[splits, d, B]`
  buffer and updates it with plain loads and stores (through L2: `.cg`). Two groups of a run may share a
  feature, and the threads that read an accumulator row for the next group are not those that wrote it
  for this one, so a barrier orders each group's update before the next. A second kernel adds the splits
  in their order. Same inputs, same bits. (Atomics into the program's own partial with the same barrier
  are also reproducible, but measured slower: 71.7 against 54.5 ms at B = 512, L = 8.6M, F = 128, G = 16.
  A loop reading each group's rows two groups early, mending those the groups in between wrote, gave the same
  bits 2.2-30x slower: triton_backward_sweep_h200_d1ec341.txt.)

Both end with `split_sum.py`'s kernel, which also transposes back to `[B, d]` and casts to the operands' dtype.
"""

import torch
import triton
import triton.language as tl

from .device import on_device, processor_count
from .split_sum import sum_splits_transposed


@triton.jit
def _grad_input_kernel(
    grad_out_ptr,  # [B, K * G]
    weight_ptr,  # [K, G, F]
    supports_ptr,  # [K, F] int32
    acc_ptr,  # fp32 [d, B] (atomic) or [splits, d, B] (deterministic)
    batch,
    num_features,
    num_groups,
    num_packs,
    packs_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PACK: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    batch_tile = tl.program_id(0)
    split = tl.program_id(1)
    rows = batch_tile * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    if DETERMINISTIC:
        acc_ptr += split.to(tl.int64) * num_features * batch
    acc_rows = acc_ptr + rows[None, :]
    first = split.to(tl.int64) * packs_per_program
    count = tl.minimum(packs_per_program, num_packs - first)
    if DETERMINISTIC:
        # Triton's software pipeline stops at the barrier: the next group's operands are loaded by hand
        # before this group's update.
        next_operands = _load_pack(
            grad_out_ptr, weight_ptr, supports_ptr, first, rows, row_mask, num_groups, G, F, BLOCK_G, BLOCK_F, PACK
        )
        for step in range(count):
            operands = next_operands
            following = first + tl.minimum(step + 1, count - 1)  # the last group loads itself again: none past K
            next_operands = _load_pack(
                grad_out_ptr,
                weight_ptr,
                supports_ptr,
                following,
                rows,
                row_mask,
                num_groups,
                G,
                F,
                BLOCK_G,
                BLOCK_F,
                PACK,
            )
            _add_pack(acc_rows, operands, batch, row_mask, PRECISION, DETERMINISTIC)
            # The next group's reads (other threads, maybe the same rows) come after these writes.
            tl.debug_barrier()
    else:
        for step in tl.range(0, count, num_stages=NUM_STAGES):
            operands = _load_pack(
                grad_out_ptr,
                weight_ptr,
                supports_ptr,
                first + step,
                rows,
                row_mask,
                num_groups,
                G,
                F,
                BLOCK_G,
                BLOCK_F,
                PACK,
            )
            _add_pack(acc_rows, operands, batch, row_mask, PRECISION, DETERMINISTIC)


@triton.jit
def _add_pack(acc_rows, operands, batch, row_mask, PRECISION: tl.constexpr, DETERMINISTIC: tl.constexpr):
    """Adds `weight_k^T @ grad_out_k^T` `[F, rows]` (fp32) of the pack's groups into the accumulator rows of their
    supports: a read-modify-write of the program's own partial (deterministic: one group a pack, whose features
    are distinct) or atomics."""
    grad_block, weight_block, features, slot_mask = operands
    update = tl.dot(weight_block, grad_block, input_precision=PRECISION)
    target = acc_rows + features[:, None].to(tl.int64) * batch
    mask = slot_mask[:, None] & row_mask[None, :]
    if DETERMINISTIC:
        current = tl.load(target, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(target, current + update, mask=mask)
    else:
        tl.atomic_add(target, update, mask=mask, sem="relaxed")


@triton.jit
def _load_pack(
    grad_out_ptr,
    weight_ptr,
    supports_ptr,
    pack,
    rows,
    row_mask,
    num_groups,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PACK: tl.constexpr,
):
    """`grad_out^T [PACK * BLOCK_G, rows]` of the PACK groups of pack `pack` (int64), their weights `[PACK * BLOCK_F,
    PACK * BLOCK_G]` (`weight_k^T` on the diagonal blocks, zeros elsewhere, never loaded: one dot for several small
    groups), their supports `[PACK * BLOCK_F]` and which slots exist."""
    labels = tl.arange(0, PACK * BLOCK_G)
    label_group = pack * PACK + labels // BLOCK_G
    label_exists = (labels % BLOCK_G < G) & (label_group < num_groups)
    slots = tl.arange(0, PACK * BLOCK_F)
    slot_group = pack * PACK + slots // BLOCK_F
    slot_exists = (slots % BLOCK_F < F) & (slot_group < num_groups)
    num_labels = num_groups * G
    columns = label_group * G + labels % BLOCK_G
    grad_block = tl.load(
        grad_out_ptr + rows[None, :].to(tl.int64) * num_labels + columns[:, None],
        mask=label_exists[:, None] & row_mask[None, :],
        other=0.0,
    )
    weight_mask = slot_exists[:, None] & label_exists[None, :]
    if PACK > 1:
        weight_mask &= slot_group[:, None] == label_group[None, :]
    weight_block = tl.load(weight_ptr + columns[None, :] * F + (slots % BLOCK_F)[:, None], mask=weight_mask, other=0.0)
    features = tl.load(supports_ptr + slot_group * F + slots % BLOCK_F, mask=slot_exists, other=0)
    return grad_block, weight_block, features, slot_exists


def _block(size: int) -> int:
    """The power-of-two tile covering `size` (at least 16, the tensor cores' smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


def launch_defaults(batch: int, num_groups: int, group_size: int, fan_in: int, deterministic: bool) -> dict:
    """The launch of one shape (chosen by shape, not autotuned; measured in triton_backward_notes.md): batch rows
    per program, programs per multiprocessor and batch tile, groups a dot (fast mode only), warps, pipeline stages."""
    return {"block_b": 32, "programs_per_sm": 4, "pack": 1, "num_warps": 4, "num_stages": 3}


def grad_input(
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    num_features: int,
    deterministic: bool,
    block_b: int | None = None,
    groups_per_program: int | None = None,
    num_stages: int | None = None,
    pack: int | None = None,
    num_warps: int | None = None,
    programs_per_sm: int | None = None,
) -> torch.Tensor:
    """`[B, d]` feature gradient of `out = group_sparse_linear(x, weight, supports)` for `grad_out [B, K * G]`,
    in the dtype of `weight`, summed in fp32; bitwise reproducible when `deterministic`.

    `block_b` (batch rows per program) and `groups_per_program` (or `programs_per_sm`) set the split of the work,
    `pack` the groups of one dot (fast mode), `num_warps` and `num_stages` the programs; each one left out takes
    `launch_defaults`' choice for the shape."""
    num_groups, group_size, fan_in = weight.shape
    batch = grad_out.shape[0]
    if not weight.is_contiguous() or supports.dtype != torch.int32 or not supports.is_contiguous():
        raise ValueError("grad_input needs a contiguous `weight` and contiguous int32 `supports` (`.contiguous()`).")
    if tuple(grad_out.shape) != (batch, num_groups * group_size) or grad_out.dtype != weight.dtype:
        raise ValueError(
            f"`grad_out` must be {weight.dtype} [B, K * G = {num_groups * group_size}], got {grad_out.dtype} "
            f"{tuple(grad_out.shape)}."
        )
    if deterministic and pack not in (None, 1):
        raise ValueError("the deterministic mode adds one group at a time: `pack` must be 1 (or None).")
    grad_x = torch.empty(batch, num_features, dtype=weight.dtype, device=weight.device)
    if grad_x.numel() == 0:
        return grad_x
    if num_groups * group_size == 0 or fan_in == 0:
        return grad_x.zero_()
    defaults = launch_defaults(batch, num_groups, group_size, fan_in, deterministic)
    block_b = block_b or defaults["block_b"]
    pack = 1 if deterministic else pack or defaults["pack"]
    grad_out = grad_out.contiguous()
    batch_tiles = triton.cdiv(batch, block_b)
    if groups_per_program is None:
        per_sm = programs_per_sm or defaults["programs_per_sm"]
        groups_per_program = triton.cdiv(num_groups, max(1, per_sm * processor_count(weight.device) // batch_tiles))
    num_packs = triton.cdiv(num_groups, pack)
    packs_per_program = triton.cdiv(groups_per_program, pack)
    splits = triton.cdiv(num_packs, packs_per_program)
    if splits > 65535:  # the launch grid's second axis
        raise ValueError(f"`groups_per_program` = {groups_per_program} splits the groups {splits} ways; at most 65535.")
    acc = torch.zeros(splits if deterministic else 1, num_features, batch, dtype=torch.float32, device=weight.device)
    fp32 = weight.dtype == torch.float32
    with on_device(weight):
        _grad_input_kernel[(batch_tiles, splits)](
            grad_out,
            weight,
            supports,
            acc,
            batch,
            num_features,
            num_groups,
            num_packs,
            packs_per_program,
            G=group_size,
            F=fan_in,
            BLOCK_G=_block(group_size),
            BLOCK_F=_block(fan_in),
            BLOCK_B=block_b,
            PACK=pack,
            DETERMINISTIC=deterministic,
            PRECISION="ieee" if fp32 else "tf32",
            NUM_STAGES=num_stages or defaults["num_stages"],
            num_warps=num_warps or defaults["num_warps"],
        )
    return sum_splits_transposed(acc, grad_x)
