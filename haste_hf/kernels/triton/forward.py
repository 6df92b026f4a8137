# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The tail's forward: logits `[B, K * G]` (+ bias) of `x [B, d]`, `weight [K, G, F]`, int32 `supports [K, F]`.

A program owns a tile of `BLOCK_B` batch rows and a run of groups (in packs of PACK groups, see `group_logits`).
Per group it gathers the group's F features of its rows once from `x^T` (`[d, Bp]`, zero-padded to whole tiles:
each feature's rows are one contiguous, coalesced load), loads the group's `[G, F]` weights (contiguous) and takes
one tensor-core dot `[BLOCK_B, F] x [F, G]` in fp32. The batch tile is the fastest program axis, so the programs that read a
group's weights run together and its weights come from DRAM once. G and F that are not powers of two are
padded to the next one by masks (correct for any G, F >= 1; tensor-core shapes waste nothing).

`group_logits` (one pack's fp32 tile) is the main loop that `loss.py` and `topk.py` share with the logits
kernel here; each kernel only has its own epilogue.
"""

import contextlib

import torch
import triton
import triton.language as tl


@triton.jit
def pack_columns(pack, K, G: tl.constexpr, BLOCK_G: tl.constexpr, PACK: tl.constexpr):
    """(int64 output columns `[PACK * BLOCK_G]` of pack `pack`, which of them exist): PACK consecutive groups,
    BLOCK_G slots each (slots >= G and groups >= K do not exist)."""
    slots = tl.arange(0, PACK * BLOCK_G)
    group = pack.to(tl.int64) * PACK + slots // BLOCK_G
    label = slots % BLOCK_G
    return group * G + label, (label < G) & (group < K)


@triton.jit
def group_logits(
    xt_ptr,
    weight_ptr,
    supports_ptr,
    bias_ptr,
    pack,
    K,
    tile_rows,
    Bp,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PACK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):
    """fp32 logits `[BLOCK_B, PACK * BLOCK_G]` of the PACK groups of pack `pack` (`pack_columns`) for the batch rows
    `tile_rows`, bias added.

    With PACK > 1 the groups' supports are gathered side by side and their weights laid on the diagonal blocks of
    one `[PACK * F, PACK * G]` operand (zeros elsewhere, never loaded): one dot and one wider store for several
    small groups, at PACK times the (cheap) tensor-core FLOPs."""
    if PACK == 1:
        labels = tl.arange(0, BLOCK_G)
        features = tl.arange(0, BLOCK_F)
        group64 = pack.to(tl.int64)
        if BLOCK_F == F:
            support = tl.load(supports_ptr + group64 * F + features)
        else:
            support = tl.load(supports_ptr + group64 * F + features, mask=features < F, other=0)
        weight_rows = weight_ptr + group64 * (G * F) + labels[:, None] * F + features[None, :]
        if BLOCK_G == G and BLOCK_F == F:
            weights = tl.load(weight_rows)
        else:
            # Padded slots of the weight tile are 0: a padded feature adds nothing (it gathered feature 0).
            weights = tl.load(weight_rows, mask=(labels[:, None] < G) & (features[None, :] < F), other=0.0)
    else:
        slots = tl.arange(0, PACK * BLOCK_F)
        feature_group = pack.to(tl.int64) * PACK + slots // BLOCK_F
        feature = slots % BLOCK_F
        feature_exists = (feature < F) & (feature_group < K)
        support = tl.load(supports_ptr + feature_group * F + feature, mask=feature_exists, other=0)
        outputs = tl.arange(0, PACK * BLOCK_G)
        label_group = pack.to(tl.int64) * PACK + outputs // BLOCK_G
        label = outputs % BLOCK_G
        on_diagonal = (label_group[:, None] == feature_group[None, :]) & (label < G)[:, None] & feature_exists[None, :]
        weight_rows = weight_ptr + label_group[:, None] * (G * F) + label[:, None] * F + feature[None, :]
        weights = tl.load(weight_rows, mask=on_diagonal, other=0.0)
    # x^T rows of the support: [PACK * BLOCK_F, BLOCK_B], each row contiguous in the batch.
    gathered = tl.load(xt_ptr + support.to(tl.int64)[:, None] * Bp + tile_rows[None, :])
    if IEEE:
        logits = tl.dot(tl.trans(gathered), tl.trans(weights), input_precision="ieee")
    else:
        logits = tl.dot(tl.trans(gathered), tl.trans(weights))
    if HAS_BIAS:
        columns, exists = pack_columns(pack, K, G, BLOCK_G, PACK)
        bias = tl.load(bias_ptr + columns, mask=exists, other=0.0)
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
    packs,
    packs_per_program,
    G: tl.constexpr,
    F: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_F: tl.constexpr,
    PACK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
):
    tile_rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    first = tl.program_id(1) * packs_per_program
    L = (tl.zeros((), dtype=tl.int64) + K) * G  # K may arrive as the constant 1 (Triton specializes it)
    out_rows = out_ptr + tile_rows.to(tl.int64)[:, None] * L
    in_batch = tile_rows[:, None] < B
    # A fixed trip count (the last run's packs past the end recompute the last one and store nothing): the loop
    # Triton pipelines, and one that its interpreter runs.
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
        columns, exists = pack_columns(pack, K, G, BLOCK_G, PACK)
        tl.store(
            out_rows + columns[None, :],
            logits.to(out_ptr.dtype.element_ty),
            mask=in_batch & exists[None, :] & (first + step < packs),
        )


class LaunchConfig:
    """Tile sizes and launch parameters of the forward family (logits, loss, top-k) for one shape. Chosen by shape,
    not autotuned: a process pays no tuning runs (see benchmarks/results/triton_notes.md for the measurements)."""

    def __init__(self, batch: int, num_groups: int, group_size: int, fan_in: int, dtype: torch.dtype, device):
        self.block_g = max(16, triton.next_power_of_2(group_size))
        self.block_f = max(16, triton.next_power_of_2(fan_in))
        # Groups of 16 labels are packed two to a dot (32 output columns, 64-byte stores per row).
        self.pack = 2 if self.block_g == 16 and self.block_f <= 64 else 1
        # Rows per tile: larger tiles read each group's weights fewer times; the gathered [PACK F, BLOCK_B] tile
        # and the [BLOCK_B, PACK G] accumulator bound it by registers.
        width = self.pack * self.block_f * self.pack * self.block_g
        block_b = 64 if batch <= 64 or width > 64 * 64 else 128
        if dtype == torch.float32:
            block_b = min(block_b, 64)
        self.block_b = block_b
        self.packs = triton.cdiv(max(num_groups, 1), self.pack)
        processors = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.programs_per_processor = 8
        self.num_warps = 4
        self.num_stages = 3
        self.ieee = dtype == torch.float32
        self.batch = batch
        self.processors = processors

    @property
    def batch_tiles(self):
        return triton.cdiv(max(self.batch, 1), self.block_b)

    @property
    def packs_per_program(self):
        # Programs: a few per SM over the whole grid, each walking a run of packs (the loop Triton pipelines).
        runs = max(1, min(self.packs, triton.cdiv(self.programs_per_processor * self.processors, self.batch_tiles)))
        return triton.cdiv(self.packs, runs)

    @property
    def runs(self):
        return triton.cdiv(self.packs, self.packs_per_program)

    @property
    def grid(self):
        return (self.batch_tiles, self.runs)

    @property
    def padded_batch(self):
        return self.batch_tiles * self.block_b

    @property
    def epilogue_warps(self):
        """Warps of the kernels with a heavy epilogue (the loss): 8 once the tile holds 64 x 64 logits, where 4
        warps spill registers (ptxas, sm_90: 4 warps at 128 rows x 32 labels use 255 registers and spill)."""
        return 8 if self.block_b * self.pack * self.block_g >= 64 * 64 else self.num_warps

    def launch_options(self, num_warps=None):
        """The keyword arguments every kernel of the family takes from this configuration."""
        return {
            "BLOCK_B": self.block_b,
            "BLOCK_G": self.block_g,
            "BLOCK_F": self.block_f,
            "PACK": self.pack,
            "IEEE": self.ieee,
            "num_warps": num_warps or self.num_warps,
            "num_stages": self.num_stages,
        }


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
            bias.contiguous() if bias is not None else weight,
            out,
            batch,
            config.padded_batch,
            num_groups,
            config.packs,
            config.packs_per_program,
            G=group_size,
            F=fan_in,
            HAS_BIAS=bias is not None,
            **config.launch_options(),
        )
    return out


__all__ = ["LaunchConfig", "forward", "group_logits", "pack_columns", "transposed_padded"]
