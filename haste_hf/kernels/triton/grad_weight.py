# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The weight gradient of the group-sparse tail in Triton: `grad_weight[k] = grad_out_k^T @ x[:, supports[k]]`.

Per (group, feature tile) and `BLOCK_B` batch rows, a program loads the group's `[rows, G]` slice of
`grad_out` (contiguous rows of `2 G` bytes) and gathers the support's rows of `x^T` (`[d, B]`, transposed once
per call: each gathered feature is then a contiguous run of batch values, where `x [B, d]` would give one
scattered element per row), and accumulates `x_I^T @ grad_out_k` `[F, G]` in fp32 on tensor cores, stored
once in the operands' dtype, transposed into `[K, G, F]`. Batches of several chunks: one group a program,
Triton's software pipeline over the chunks. A batch of one chunk: a program walks a run of groups, the
pipeline over the groups. fp32 operands use a true fp32 product (`input_precision="ieee"`, no TF32).
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
    SINGLE_CHUNK: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    feature_tiles: tl.constexpr = (F + BLOCK_F - 1) // BLOCK_F
    program = tl.program_id(0)
    slots = (program % feature_tiles) * BLOCK_F + tl.arange(0, BLOCK_F)
    labels = tl.arange(0, BLOCK_G)
    slot_mask = slots < F
    out_mask = slot_mask[:, None] & (labels < G)[None, :]
    out_type = grad_weight_ptr.dtype.element_ty
    group = (program // feature_tiles).to(tl.int64)
    if SINGLE_CHUNK:
        # The batch is one chunk: a program walks a run of groups, and the software pipeline runs ahead into
        # the next group's loads (one group a program would leave it nothing to overlap).
        first = group * groups_per_program
        for step in tl.range(0, tl.minimum(groups_per_program, num_groups - first), num_stages=NUM_STAGES):
            x_block, grad_block = _load_chunk(
                grad_out_ptr, xt_ptr, supports_ptr, first + step, 0, slots, labels, batch, num_groups, G, F, BLOCK_B
            )
            product = tl.dot(x_block, grad_block, input_precision=PRECISION)  # [F, G]
            out = grad_weight_ptr + (first + step) * G * F + labels[None, :] * F + slots[:, None]
            tl.store(out, product.to(out_type), mask=out_mask)
    else:
        # One group a program, the software pipeline over its batch chunks; the result stored once.
        acc = tl.zeros((BLOCK_F, BLOCK_G), dtype=tl.float32)
        for start in tl.range(0, batch, BLOCK_B, num_stages=NUM_STAGES):
            x_block, grad_block = _load_chunk(
                grad_out_ptr, xt_ptr, supports_ptr, group, start, slots, labels, batch, num_groups, G, F, BLOCK_B
            )
            acc = tl.dot(x_block, grad_block, acc, input_precision=PRECISION)
        out = grad_weight_ptr + group * G * F + labels[None, :] * F + slots[:, None]
        tl.store(out, acc.to(out_type), mask=out_mask)


@triton.jit
def _load_chunk(
    grad_out_ptr,
    xt_ptr,
    supports_ptr,
    group,
    start,
    slots,
    labels,
    batch,
    num_groups,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """x_I^T `[F, rows]` (gathered rows of x^T) and grad_out_k `[rows, G]` of group `group` (int64) for the
    batch rows `[start, start + BLOCK_B)`."""
    rows = start + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    slot_mask = slots < F
    features = tl.load(supports_ptr + group * F + slots, mask=slot_mask, other=0).to(tl.int64)
    x_block = tl.load(
        xt_ptr + features[:, None] * batch + rows[None, :], mask=slot_mask[:, None] & row_mask[None, :], other=0.0
    )
    # 64-bit: B * K * G passes 2^31 at millions of labels.
    grad_rows = rows[:, None].to(tl.int64) * (num_groups * G)
    grad_block = tl.load(
        grad_out_ptr + grad_rows + group * G + labels[None, :],
        mask=row_mask[:, None] & (labels < G)[None, :],
        other=0.0,
    )
    return x_block, grad_block


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
    in the dtype of `x` (bf16, fp16 or fp32), summed over the batch in fp32. When the batch is one chunk
    (B <= 64; fp32: 32), `groups_per_program` consecutive groups a program (default: about 16 programs per
    multiprocessor); otherwise one group a program."""
    num_groups, fan_in = supports.shape
    batch = x.shape[0]
    if supports.dtype != torch.int32 or not supports.is_contiguous():
        raise ValueError("grad_weight needs contiguous int32 `supports`; use `supports.int().contiguous()`.")
    if tuple(grad_out.shape) != (batch, num_groups * group_size) or grad_out.dtype != x.dtype:
        raise ValueError(
            f"`grad_out` must be {x.dtype} [B, K * G = {num_groups * group_size}], got {grad_out.dtype} "
            f"{tuple(grad_out.shape)}."
        )
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
    block_b = 64 if x.dtype != torch.float32 else 32
    single_chunk = batch <= block_b
    if not single_chunk:
        # Several chunks: one group a program (runs of groups: 1.15-2.1x slower at B = 512, G = 16, on an H200).
        groups_per_program = 1
    elif groups_per_program is None:
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
        BLOCK_B=block_b,
        SINGLE_CHUNK=single_chunk,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        NUM_STAGES=3,
        num_warps=4,
    )
    return grad_weight_out


@functools.cache
def _processor_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
