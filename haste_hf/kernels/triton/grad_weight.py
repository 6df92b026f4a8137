# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The weight gradient of the group-sparse tail in Triton: `grad_weight[k] = grad_out_k^T @ x[:, supports[k]]`.

A program walks a run of consecutive groups (one feature tile of each) and, per group, the whole batch: per
`BLOCK_B` rows it loads the group's `[rows, G]` slice of `grad_out` (contiguous rows of `2 G` bytes) and
gathers the support's rows of `x^T` (`[d, B]`, transposed once per call: each gathered feature is then a
contiguous run of batch values, where `x [B, d]` would give one scattered element per row), and accumulates
`x_I^T @ grad_out_k` `[F, G]` in fp32 on tensor cores. The result is stored once, in the operands' dtype,
transposed into `[K, G, F]`. fp32 operands use a true fp32 product (`input_precision="ieee"`, no TF32).
"""

import functools

import torch
import triton
import triton.language as tl


@triton.jit
def _grad_weight_kernel(
    grad_out_ptr,  # [B, K * G]
    xt_ptr,  # [d, B], x transposed
    supports_ptr,  # [K, F] int32
    grad_weight_ptr,  # [K, G, F]
    batch,
    num_groups,
    groups_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    feature_tiles: tl.constexpr = (F + BLOCK_F - 1) // BLOCK_F
    program = tl.program_id(0)
    slots = (program % feature_tiles) * BLOCK_F + tl.arange(0, BLOCK_F)
    first = (program // feature_tiles).to(tl.int64) * groups_per_program
    count = tl.minimum(groups_per_program, num_groups - first)
    labels = tl.arange(0, BLOCK_G)
    rows = tl.arange(0, BLOCK_B)
    slot_mask = slots < F
    label_mask = labels < G
    num_labels = num_groups * G
    chunks = tl.cdiv(batch, BLOCK_B)
    acc = tl.zeros((BLOCK_F, BLOCK_G), dtype=tl.float32)
    # One loop over (group, batch chunk) pairs, so that the software pipeline also runs ahead into the next
    # group (at small batches a group is one or two chunks).
    for step in tl.range(0, count * chunks, num_stages=NUM_STAGES):
        group = first + step // chunks
        start = (step % chunks) * BLOCK_B
        row_mask = rows + start < batch
        features = tl.load(supports_ptr + group * F + slots, mask=slot_mask, other=0).to(tl.int64)
        # 64-bit: B * K * G passes 2^31 at millions of labels.
        grad_rows = (start + rows[:, None]).to(tl.int64) * num_labels
        grad_block = tl.load(
            grad_out_ptr + grad_rows + group * G + labels[None, :],
            mask=row_mask[:, None] & label_mask[None, :],
            other=0.0,
        )
        x_block = tl.load(
            xt_ptr + features[:, None] * batch + start + rows[None, :],
            mask=slot_mask[:, None] & row_mask[None, :],
            other=0.0,
        )
        acc = tl.dot(x_block, grad_block, acc, input_precision=PRECISION)  # [F, G]
        done = start + BLOCK_B >= batch  # the group's last chunk: store, start the next group from zero
        out = grad_weight_ptr + group * G * F + labels[None, :] * F + slots[:, None]
        tl.store(out, acc.to(grad_weight_ptr.dtype.element_ty), mask=slot_mask[:, None] & label_mask[None, :] & done)
        acc = tl.where(done, 0.0, acc)


def _block(size: int) -> int:
    """The power-of-two tile covering `size` (at least 16, the tensor cores' smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


def grad_weight(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    supports: torch.Tensor,
    group_size: int,
    groups_per_program: int | None = None,
) -> torch.Tensor:
    """`[K, G, F]` weight gradient of `out = group_sparse_linear(x, weight, supports)` for `grad_out [B, K * G]`,
    in the dtype of `x` (bf16, fp16 or fp32), summed over the batch in fp32. `groups_per_program` (default:
    about 16 programs per multiprocessor) sets how many consecutive groups a program walks."""
    num_groups, fan_in = supports.shape
    batch = x.shape[0]
    grad_weight_out = torch.empty(num_groups, group_size, fan_in, dtype=x.dtype, device=x.device)
    if grad_weight_out.numel() == 0:
        return grad_weight_out
    if batch == 0:
        return grad_weight_out.zero_()
    grad_out = grad_out.contiguous()
    xt = x.t().contiguous()
    block_g = _block(group_size)
    # Accumulator [F, G] at most 64 x 64 fp32 per program; wider supports split into feature tiles.
    block_f = min(_block(fan_in), max(16, 4096 // block_g))
    if groups_per_program is None:
        groups_per_program = max(1, num_groups // (16 * _processor_count(x.device)))
    programs = triton.cdiv(num_groups, groups_per_program) * triton.cdiv(fan_in, block_f)
    _grad_weight_kernel[(programs,)](
        grad_out,
        xt,
        supports,
        grad_weight_out,
        batch,
        num_groups,
        groups_per_program,
        G=group_size,
        F=fan_in,
        BLOCK_G=block_g,
        BLOCK_F=block_f,
        BLOCK_B=64 if x.dtype != torch.float32 else 32,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        NUM_STAGES=3,
        num_warps=4,
    )
    return grad_weight_out


@functools.cache
def _processor_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
