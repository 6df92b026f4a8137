# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The weight gradient of the group-sparse tail in Triton: `grad_weight[k] = grad_out_k^T @ x[:, supports[k]]`.

Per (group, feature tile) and `BLOCK_B` batch rows, a program loads the group's `[rows, G]` slice of
`grad_out` (contiguous rows of `2 G` bytes) and gathers the support's rows of `x^T` (`[d, B]`, transposed once
per call: each gathered feature is then a contiguous run of batch values, where `x [B, d]` would give one
scattered element per row), and accumulates `x_I^T @ grad_out_k` `[F, G]` in fp32 on tensor cores, stored
once in the operands' dtype, transposed into `[K, G, F]`. Batches of several chunks: one group a program,
Triton's software pipeline over the chunks. A batch of one chunk: a program walks a run of groups, the
pipeline over the groups. `pack` groups can share one dot (their supports gathered side by side, their
`grad_out` columns side by side, the diagonal blocks of the product stored): fewer, larger loop steps for
small F and G (two by default where measured faster: `launch_defaults`). fp32 operands use a true fp32 product (`input_precision="ieee"`, no TF32).
"""

import torch
import triton
import triton.language as tl

from .device import on_device, processor_count


@triton.jit
def _grad_weight_kernel(
    grad_out_ptr,  # [B, K * G]
    xt_ptr,  # [d, B], x transposed
    supports_ptr,  # [K, F] int32
    grad_weight_ptr,  # [K, G, F]
    batch,
    num_groups,
    num_packs,
    packs_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PACK: tl.constexpr,
    SINGLE_CHUNK: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    feature_tiles: tl.constexpr = (F + BLOCK_F - 1) // BLOCK_F
    program = tl.program_id(0)
    # PACK groups side by side (PACK > 1 only with one feature tile): slot i holds feature i % BLOCK_F of the
    # pack's group i // BLOCK_F, label j label j % BLOCK_G of its group j // BLOCK_G.
    lanes = tl.arange(0, PACK * BLOCK_F)
    slot_group = lanes // BLOCK_F
    slots = (program % feature_tiles) * BLOCK_F + lanes % BLOCK_F
    columns = tl.arange(0, PACK * BLOCK_G)
    label_group = columns // BLOCK_G
    labels = columns % BLOCK_G
    out_type = grad_weight_ptr.dtype.element_ty
    pack = (program // feature_tiles).to(tl.int64)
    if SINGLE_CHUNK:
        # The batch is one chunk: a program walks a run of packs, and the software pipeline runs ahead into
        # the next pack's loads (one pack a program would leave it nothing to overlap).
        first = pack * packs_per_program
        for step in tl.range(0, tl.minimum(packs_per_program, num_packs - first), num_stages=NUM_STAGES):
            x_block, grad_block = _load_chunk(
                grad_out_ptr,
                xt_ptr,
                supports_ptr,
                first + step,
                0,
                slot_group,
                slots,
                label_group,
                labels,
                batch,
                num_groups,
                G,
                F,
                BLOCK_B,
                PACK,
            )
            product = tl.dot(x_block, grad_block, input_precision=PRECISION)  # [PACK F, PACK G]
            _store_pack(
                grad_weight_ptr,
                product.to(out_type),
                first + step,
                slot_group,
                slots,
                label_group,
                labels,
                num_groups,
                G,
                F,
                PACK,
            )
    else:
        # One pack a program, the software pipeline over its batch chunks; the result stored once.
        acc = tl.zeros((PACK * BLOCK_F, PACK * BLOCK_G), dtype=tl.float32)
        for start in tl.range(0, batch, BLOCK_B, num_stages=NUM_STAGES):
            x_block, grad_block = _load_chunk(
                grad_out_ptr,
                xt_ptr,
                supports_ptr,
                pack,
                start,
                slot_group,
                slots,
                label_group,
                labels,
                batch,
                num_groups,
                G,
                F,
                BLOCK_B,
                PACK,
            )
            acc = tl.dot(x_block, grad_block, acc, input_precision=PRECISION)
        _store_pack(
            grad_weight_ptr, acc.to(out_type), pack, slot_group, slots, label_group, labels, num_groups, G, F, PACK
        )


@triton.jit
def _store_pack(
    grad_weight_ptr,
    product,
    pack,
    slot_group,
    slots,
    label_group,
    labels,
    num_groups,
    G: tl.constexpr,
    F: tl.constexpr,
    PACK: tl.constexpr,
):
    """Stores the diagonal blocks of the pack's `[PACK F, PACK G]` product (each group's `x_I^T @ grad_out_k`)
    into `grad_weight [K, G, F]`."""
    group = pack * PACK + label_group
    mask = (slots < F)[:, None] & ((labels < G) & (group < num_groups))[None, :]
    if PACK > 1:
        mask &= slot_group[:, None] == label_group[None, :]
    out = grad_weight_ptr + (group * G + labels)[None, :] * F + slots[:, None]
    tl.store(out, product, mask=mask)


@triton.jit
def _load_chunk(
    grad_out_ptr,
    xt_ptr,
    supports_ptr,
    pack,
    start,
    slot_group,
    slots,
    label_group,
    labels,
    batch,
    num_groups,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    PACK: tl.constexpr,
):
    """x_I^T `[PACK F, rows]` (gathered rows of x^T) and grad_out `[rows, PACK G]` of the groups of pack `pack`
    (int64) for the batch rows `[start, start + BLOCK_B)`."""
    rows = start + tl.arange(0, BLOCK_B)
    row_mask = rows < batch
    slot_groups = pack * PACK + slot_group
    slot_mask = (slots < F) & (slot_groups < num_groups)
    features = tl.load(supports_ptr + slot_groups * F + slots, mask=slot_mask, other=0).to(tl.int64)
    x_block = tl.load(
        xt_ptr + features[:, None] * batch + rows[None, :], mask=slot_mask[:, None] & row_mask[None, :], other=0.0
    )
    # 64-bit: B * K * G passes 2^31 at millions of labels.
    grad_rows = rows[:, None].to(tl.int64) * (num_groups * G)
    label_groups = pack * PACK + label_group
    grad_block = tl.load(
        grad_out_ptr + grad_rows + (label_groups * G + labels)[None, :],
        mask=row_mask[:, None] & ((labels < G) & (label_groups < num_groups))[None, :],
        other=0.0,
    )
    return x_block, grad_block


def _block(size: int) -> int:
    """The power-of-two tile covering `size` (at least 16, the tensor cores' smallest operand side)."""
    return max(16, triton.next_power_of_2(size))


def launch_defaults(batch: int, num_groups: int, group_size: int, fan_in: int, dtype: torch.dtype) -> dict:
    """The launch of one shape (chosen by shape, not autotuned; measured in triton_backward_notes.md): batch rows a
    chunk, groups a dot, programs per multiprocessor (a batch of one chunk), warps, pipeline stages.

    Two groups a dot at F <= 32, G <= 32 in 16-bit dtypes: on one H200, L = 8.6M, bf16
    (triton_backward_sweep_h200_d1ec341.txt), B = 512, F = 32, G = 16: 4.07 ms against 7.46 for one group (CUDA
    6.58; 8 warps: 4.27 against 8.11); B = 64, F = 32, G = 64, 8 warps: 0.58 against 0.63 (CUDA 0.63; the 4-warp
    lines of that shape were lost). Not at G = 64: its pack takes 74 KB of shared memory (sm_90 ptxas,
    triton_backward_ptxas_sm90_5ec595a.txt), over the 64 KB of a Turing GPU, where F <= 32, G <= 32 takes at most
    49 KB and one group a dot at most 61 KB; wider supports are not measured."""
    pack = 2 if dtype != torch.float32 and _block(fan_in) <= 32 and _block(group_size) <= 32 else 1
    return {
        "block_b": 64 if dtype != torch.float32 else 32,
        "pack": pack,
        "programs_per_sm": 16,
        "num_warps": 4,
        "num_stages": 3,
    }


def grad_weight(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    supports: torch.Tensor,
    group_size: int,
    groups_per_program: int | None = None,
    block_b: int | None = None,
    pack: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    programs_per_sm: int | None = None,
) -> torch.Tensor:
    """`[K, G, F]` weight gradient of `out = group_sparse_linear(x, weight, supports)` for `grad_out [B, K * G]`,
    in the dtype of `x` (bf16, fp16 or fp32), summed over the batch in fp32. When the batch is one chunk
    (`block_b` rows), `groups_per_program` consecutive groups a program (default: `programs_per_sm` programs per
    multiprocessor); otherwise one pack of `pack` groups a program. Each launch parameter left out takes
    `launch_defaults`' choice for the shape."""
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
    defaults = launch_defaults(batch, num_groups, group_size, fan_in, x.dtype)
    grad_out = grad_out.contiguous()
    xt = x.t().contiguous()
    block_g = _block(group_size)
    # Accumulator [F, G] at most 64 x 64 fp32 per program; wider supports split into feature tiles.
    block_f = min(_block(fan_in), max(16, 4096 // block_g))
    block_b = block_b or defaults["block_b"]
    pack = pack or defaults["pack"]
    if pack > 1 and block_f < fan_in:
        raise ValueError(f"`pack` = {pack} needs the support in one feature tile (F <= {block_f}); use pack=1.")
    num_packs = triton.cdiv(num_groups, pack)
    single_chunk = batch <= block_b
    if not single_chunk:
        # Several chunks: one pack a program (runs of groups: 1.15-2.1x slower at B = 512, G = 16, on an H200).
        packs_per_program = 1
    elif groups_per_program is None:
        per_sm = programs_per_sm or defaults["programs_per_sm"]
        packs_per_program = max(1, num_packs // (per_sm * processor_count(x.device)))
    else:
        packs_per_program = triton.cdiv(groups_per_program, pack)
    programs = triton.cdiv(num_packs, packs_per_program) * triton.cdiv(fan_in, block_f)
    with on_device(x):
        _grad_weight_kernel[(programs,)](
            grad_out,
            xt,
            supports,
            grad_weight_out,
            batch,
            num_groups,
            num_packs,
            packs_per_program,
            G=group_size,
            F=fan_in,
            BLOCK_G=block_g,
            BLOCK_F=block_f,
            BLOCK_B=block_b,
            PACK=pack,
            SINGLE_CHUNK=single_chunk,
            PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            NUM_STAGES=num_stages or defaults["num_stages"],
            num_warps=num_warps or defaults["num_warps"],
        )
    return grad_weight_out
