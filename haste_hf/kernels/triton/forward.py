# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The tail's forward: logits `[B, K * G]` (+ bias) of `x [B, d]`, `weight [K, G, F]`, int32 `supports [K, F]`.

A program owns a tile of `BLOCK_B` batch rows and a run of groups. Per group it gathers the group's F features of
its rows once from `x^T` (`[d, Bp]`, zero-padded to whole tiles: each feature's rows are one contiguous,
coalesced load), loads the group's `[G, F]` weights (contiguous) and takes one tensor-core dot
`[BLOCK_B, F] x [F, G]` in fp32. The batch tile is the fastest program axis, so the programs that read a
group's weights run together and its weights come from DRAM once. G and F that are not powers of two are
padded to the next one by masks (correct for any G, F >= 1; tensor-core shapes waste nothing).

`group_logits` (one group's fp32 tile) is the main loop that `loss.py` and `topk.py` share with the logits
kernel here; each kernel only has its own epilogue.
"""

import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def group_logits(
    xt_ptr,
    weight_ptr,
    supports_ptr,
    bias_ptr,
    group,
    tile_rows,
    Bp,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):
    """fp32 logits `[BLOCK_B, BLOCK_G]` of group `group` for the batch rows `tile_rows` (bias added)."""
    labels = tl.arange(0, BLOCK_G)
    features = tl.arange(0, BLOCK_F)
    group64 = group.to(tl.int64)
    if BLOCK_F == F:
        support = tl.load(supports_ptr + group64 * F + features)
    else:
        support = tl.load(supports_ptr + group64 * F + features, mask=features < F, other=0)
    # x^T rows of the support: [BLOCK_F, BLOCK_B], each row contiguous in the batch.
    gathered = tl.load(xt_ptr + support.to(tl.int64)[:, None] * Bp + tile_rows[None, :])
    weight_rows = weight_ptr + group64 * (G * F) + labels[:, None] * F + features[None, :]
    if BLOCK_G == G and BLOCK_F == F:
        weights = tl.load(weight_rows)
    else:
        # Padded slots of the weight tile are 0: a padded feature adds nothing (it gathered feature 0).
        weights = tl.load(weight_rows, mask=(labels[:, None] < G) & (features[None, :] < F), other=0.0)
    if IEEE:
        logits = tl.dot(tl.trans(gathered), tl.trans(weights), input_precision="ieee")
    else:
        logits = tl.dot(tl.trans(gathered), tl.trans(weights))
    if HAS_BIAS:
        bias = tl.load(bias_ptr + group64 * G + labels, mask=labels < G, other=0.0)
        logits += bias.to(tl.float32)[None, :]
    return logits


@triton.jit
def _forward_kernel(
    xt_ptr,
    weight_ptr,
    supports_ptr,
    bias_ptr,
    out_ptr,
    B,
    Bp,
    K,
    groups_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):
    tile_rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    labels = tl.arange(0, BLOCK_G)
    first = tl.program_id(1) * groups_per_program
    L = K.to(tl.int64) * G
    out_rows = out_ptr + tile_rows.to(tl.int64)[:, None] * L + labels[None, :]
    store_mask = (tile_rows[:, None] < B) & (labels[None, :] < G)
    # A fixed trip count (the last run's groups past K recompute group K - 1 and store nothing): the loop
    # Triton pipelines, and one that its interpreter runs.
    for step in range(groups_per_program):
        group = tl.minimum(first + step, K - 1)
        logits = group_logits(
            xt_ptr, weight_ptr, supports_ptr, bias_ptr, group, tile_rows, Bp, G, F, BLOCK_G, BLOCK_F, HAS_BIAS, IEEE
        )
        tl.store(
            out_rows + group.to(tl.int64) * G,
            logits.to(out_ptr.dtype.element_ty),
            mask=store_mask & (first + step < K),
        )


class LaunchConfig:
    """Tile sizes and launch parameters of the forward family (logits, loss, top-k) for one shape."""

    def __init__(self, batch: int, num_groups: int, group_size: int, fan_in: int, dtype: torch.dtype, device):
        self.block_g = max(16, triton.next_power_of_2(group_size))
        self.block_f = max(16, triton.next_power_of_2(fan_in))
        # Rows per tile: larger tiles read each group's weights fewer times; the gathered [F, BLOCK_B] tile
        # and the [BLOCK_B, G] accumulator bound it by registers.
        block_b = 64 if batch <= 64 or self.block_f * self.block_g > 64 * 64 else 128
        if dtype == torch.float32:
            block_b = min(block_b, 64)
        self.block_b = block_b
        self.batch_tiles = triton.cdiv(max(batch, 1), block_b)
        # Programs: a few per SM over the whole grid, each walking a run of groups (the loop that Triton
        # pipelines); at least one group per program.
        processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        runs = max(1, min(num_groups, triton.cdiv(8 * processors, self.batch_tiles)))
        self.groups_per_program = triton.cdiv(max(num_groups, 1), runs)
        self.runs = triton.cdiv(max(num_groups, 1), self.groups_per_program)
        self.num_warps = 4
        self.num_stages = 3
        self.ieee = dtype == torch.float32

    @property
    def grid(self):
        return (self.batch_tiles, self.runs)

    @property
    def padded_batch(self):
        return self.batch_tiles * self.block_b


def transposed_padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x^T `[d, rows]`, zero beyond x's batch: the gather source of the forward family."""
    xt = x.new_zeros(x.shape[1], rows)
    xt[:, : x.shape[0]] = x.t()
    return xt


def forward(
    x: torch.Tensor, weight: torch.Tensor, supports: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits `[B, K * G]` in x's dtype (fp32 accumulation; fp32 operands multiply in true fp32, no TF32)."""
    batch = x.shape[0]
    num_groups, group_size, fan_in = weight.shape
    out = x.new_empty(batch, num_groups * group_size)
    if out.numel() == 0:
        return out
    if fan_in == 0:
        return out.copy_(bias.expand_as(out)) if bias is not None else out.zero_()
    config = LaunchConfig(batch, num_groups, group_size, fan_in, x.dtype, x.device)
    xt = transposed_padded(x, config.padded_batch)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _forward_kernel[config.grid](
            xt,
            weight,
            supports,
            bias if bias is not None else weight,
            out,
            batch,
            config.padded_batch,
            num_groups,
            config.groups_per_program,
            G=group_size,
            F=fan_in,
            BLOCK_B=config.block_b,
            BLOCK_G=config.block_g,
            BLOCK_F=config.block_f,
            HAS_BIAS=bias is not None,
            IEEE=config.ieee,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out


__all__ = ["LaunchConfig", "forward", "group_logits", "transposed_padded"]
