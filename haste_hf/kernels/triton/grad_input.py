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
  groups' operands in flight.
- deterministic mode (no float atomics): each program owns a partial `[d, BLOCK_B]` of a `[splits, d, B]`
  buffer and updates it with plain loads and stores (through L2: `.cg`). Two groups of a run may share a
  feature, and the threads that read an accumulator row for the next group are not those that wrote it
  for this one, so a barrier orders each group's update before the next. A second kernel adds the splits
  in their order. Same inputs, same bits. (Atomics into the program's own partial with the same barrier
  are also reproducible, but measured slower: 71.7 against 54.5 ms at B = 512, L = 8.6M, F = 128, G = 16.)

Both end with that kernel, which also transposes back to `[B, d]` and casts to the operands' dtype.
"""

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _grad_input_kernel(
    grad_out_ptr,  # [B, K * G]
    weight_ptr,  # [K, G, F]
    supports_ptr,  # [K, F] int32
    acc_ptr,  # fp32 [d, B] (atomic) or [splits, d, B] (deterministic)
    batch,
    num_features,
    num_groups,
    groups_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    batch_tile = tl.program_id(0)
    split = tl.program_id(1)
    rows = batch_tile * BLOCK_B + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    labels = tl.arange(0, BLOCK_G)
    slots = tl.arange(0, BLOCK_F)
    label_mask = labels < G
    slot_mask = slots < F
    num_labels = num_groups * G
    grad_out_rows = grad_out_ptr + rows[None, :].to(tl.int64) * num_labels + labels[:, None]  # [G, rows]
    weight_slots = weight_ptr + slots[:, None] + labels[None, :] * F  # [F, G]
    if DETERMINISTIC:
        acc_ptr += split.to(tl.int64) * num_features * batch
    acc_rows = acc_ptr + rows[None, :]
    first = split.to(tl.int64) * groups_per_program
    count = tl.minimum(groups_per_program, num_groups - first)
    operand_masks = (label_mask[:, None] & row_mask[None, :], slot_mask[:, None] & label_mask[None, :], slot_mask)
    mask = slot_mask[:, None] & row_mask[None, :]
    if DETERMINISTIC:
        # Triton's software pipeline stops at the barrier: the next group's operands are loaded by hand
        # before this group's update.
        next_operands = _load_group(grad_out_rows, weight_slots, supports_ptr, first, G, F, operand_masks)
        for step in range(count):
            operands = next_operands
            following = first + tl.minimum(step + 1, count - 1)  # the last group loads itself again: none past K
            next_operands = _load_group(grad_out_rows, weight_slots, supports_ptr, following, G, F, operand_masks)
            _add_group(acc_rows, operands, batch, mask, PRECISION, DETERMINISTIC)
            # The next group's reads (other threads, maybe the same rows) come after these writes.
            tl.debug_barrier()
    else:
        for step in tl.range(0, count, num_stages=NUM_STAGES):
            operands = _load_group(grad_out_rows, weight_slots, supports_ptr, first + step, G, F, operand_masks)
            _add_group(acc_rows, operands, batch, mask, PRECISION, DETERMINISTIC)


@triton.jit
def _add_group(acc_rows, operands, batch, mask, PRECISION: tl.constexpr, DETERMINISTIC: tl.constexpr):
    """Adds `weight_k^T @ grad_out_k^T` `[F, rows]` (fp32) into the accumulator rows of the group's support:
    a read-modify-write of the program's own partial (deterministic) or atomics."""
    grad_block, weight_block, features = operands
    update = tl.dot(weight_block, grad_block, input_precision=PRECISION)
    target = acc_rows + features[:, None].to(tl.int64) * batch
    if DETERMINISTIC:
        current = tl.load(target, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(target, current + update, mask=mask)
    else:
        tl.atomic_add(target, update, mask=mask, sem="relaxed")


@triton.jit
def _load_group(grad_out_rows, weight_slots, supports_ptr, group, G: tl.constexpr, F: tl.constexpr, masks):
    """`grad_out_k^T [G, rows]`, `weight_k^T [F, G]` and the support of group `group` (int64)."""
    grad_mask, weight_mask, slot_mask = masks
    grad_block = tl.load(grad_out_rows + group * G, mask=grad_mask, other=0.0)
    weight_block = tl.load(weight_slots + group * G * F, mask=weight_mask, other=0.0)
    features = tl.load(supports_ptr + group * F + tl.arange(0, slot_mask.shape[0]), mask=slot_mask, other=0)
    return grad_block, weight_block, features


@triton.jit
def _reduce_transpose_kernel(
    acc_ptr,  # fp32 [splits, d, B]
    grad_x_ptr,  # [B, d]
    batch,
    num_features,
    splits,
    BLOCK_D: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    features = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    mask = (features[:, None] < num_features) & (rows[None, :] < batch)
    offsets = features[:, None] * batch + rows[None, :]
    total = tl.zeros((BLOCK_D, BLOCK_B), dtype=tl.float32)
    split_size = num_features.to(tl.int64) * batch
    for _ in range(splits):  # a fixed order: the same sum on every run
        total += tl.load(acc_ptr + offsets, mask=mask, other=0.0)
        acc_ptr += split_size
    out = grad_x_ptr + rows[None, :].to(tl.int64) * num_features + features[:, None]
    tl.store(out, total.to(grad_x_ptr.dtype.element_ty), mask=mask)


def _block(size: int) -> int:
    """The power-of-two tile covering `size` (at least 16, the tensor cores' smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


@functools.cache
def _program_count(device: torch.device) -> int:
    """Programs of one launch: a few per multiprocessor, enough to hide the latency of the updates."""
    if device.type != "cuda":
        return 8
    return 4 * torch.cuda.get_device_properties(device).multi_processor_count


def grad_input(
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    supports: torch.Tensor,
    num_features: int,
    deterministic: bool,
    block_b: int = 32,
    groups_per_program: int | None = None,
    num_stages: int = 3,
) -> torch.Tensor:
    """`[B, d]` feature gradient of `out = group_sparse_linear(x, weight, supports)` for `grad_out [B, K * G]`,
    in the dtype of `weight`, summed in fp32; bitwise reproducible when `deterministic`.

    `block_b` (batch rows per program) and `groups_per_program` set the split of the work (the
    default spreads the groups over a few programs per multiprocessor and batch tile)."""
    num_groups, group_size, fan_in = weight.shape
    batch = grad_out.shape[0]
    if not weight.is_contiguous() or supports.dtype != torch.int32 or not supports.is_contiguous():
        raise ValueError("grad_input needs a contiguous `weight` and contiguous int32 `supports` (`.contiguous()`).")
    if tuple(grad_out.shape) != (batch, num_groups * group_size) or grad_out.dtype != weight.dtype:
        raise ValueError(
            f"`grad_out` must be {weight.dtype} [B, K * G = {num_groups * group_size}], got {grad_out.dtype} "
            f"{tuple(grad_out.shape)}."
        )
    grad_x = torch.empty(batch, num_features, dtype=weight.dtype, device=weight.device)
    if grad_x.numel() == 0:
        return grad_x
    if num_groups * group_size == 0 or fan_in == 0:
        return grad_x.zero_()
    grad_out = grad_out.contiguous()
    batch_tiles = triton.cdiv(batch, block_b)
    if groups_per_program is None:
        groups_per_program = triton.cdiv(num_groups, max(1, _program_count(weight.device) // batch_tiles))
    splits = triton.cdiv(num_groups, groups_per_program)
    if splits > 65535:  # the launch grid's second axis
        raise ValueError(f"`groups_per_program` = {groups_per_program} splits the groups {splits} ways; at most 65535.")
    acc = torch.zeros(splits if deterministic else 1, num_features, batch, dtype=torch.float32, device=weight.device)
    fp32 = weight.dtype == torch.float32
    _grad_input_kernel[(batch_tiles, splits)](
        grad_out,
        weight,
        supports,
        acc,
        batch,
        num_features,
        num_groups,
        groups_per_program,
        G=group_size,
        F=fan_in,
        BLOCK_G=_block(group_size),
        BLOCK_F=_block(fan_in),
        BLOCK_B=block_b,
        DETERMINISTIC=deterministic,
        PRECISION="ieee" if fp32 else "tf32",
        NUM_STAGES=num_stages,
        num_warps=4,
    )
    reduce_d, reduce_b = 32, 64
    _reduce_transpose_kernel[(triton.cdiv(num_features, reduce_d), triton.cdiv(batch, reduce_b))](
        acc, grad_x, batch, num_features, acc.shape[0], BLOCK_D=reduce_d, BLOCK_B=reduce_b, num_warps=4
    )
    return grad_x
