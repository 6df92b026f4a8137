# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The output layer's initial rows, drawn block by block so that any share of them can be built alone.

Head rows and tail groups are drawn in blocks of `INITIAL_BLOCK_ROWS`; block b of a tensor comes from a generator
seeded by (seed, tensor, b) alone. The rows `[first, stop)` of the whole layer are therefore the same whether one
process builds all of them or a rank of a sharded run builds only its share: a rank of a 10^9-label run builds its
own rows (`haste_hf.training.sharded_output_layer`), never the whole layer, which fits no host, and 1 GPU and N GPUs
start from the same weights.

- supports: `random_supports`, from the configuration's `supports_seed`;
- weights: from one `weight_seed` that `HastePreTrainedModel._init_weights` draws from torch's global generator
  (every rank of a run draws the same one, as it seeds alike), the head N(0, std) as transformers initialises a
  linear layer, the tail U(-1/sqrt(F), 1/sqrt(F)) as the paper does; biases zero.

`deferred_output_rows()` builds a model's head and tail on the meta device, to be built per rank when sharded.
"""

import contextlib
import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch


# Rows (head rows, tail groups) of one block: a block's transient draw stays small (16 MB of tail weights at G 16,
# F 64), and a share's first and last blocks are the only ones drawn beyond it.
INITIAL_BLOCK_ROWS = 4096
# The tensors' streams: each of its own generators, so that adding a tensor changes none of the others.
SUPPORTS_STREAM, TAIL_WEIGHT_STREAM, HEAD_WEIGHT_STREAM = 0, 1, 2
_MASK = (1 << 64) - 1

# Where `HasteForExtremeClassification.__init__` builds its head and tail, as `HasteOutputLayer` keywords: None (fp32
# on the CPU), `rows_device="meta"` (`deferred_output_rows`), or a device and dtype (`output_rows_on`).
OUTPUT_ROWS = contextvars.ContextVar("haste_output_rows", default=None)


@contextlib.contextmanager
def _output_rows(placement: dict | None):
    token = OUTPUT_ROWS.set(placement)
    try:
        yield
    finally:
        OUTPUT_ROWS.reset(token)


def deferred_output_rows(defer: bool = True):
    """Within the block, new HASTE models build their head and tail on the meta device (no memory, no values):
    `shard_output_layer_` then builds each rank's share of them directly. Nothing else may use those rows first."""
    return _output_rows({"rows_device": "meta"} if defer else None)


def output_rows_on(device=None, dtype: torch.dtype | None = None):
    """Within the block, new HASTE models build their head and tail on `device` (None: the CPU) in `dtype` (None:
    fp32), the rows drawn as ever (fp32, block by block on the CPU) and each block cast into place: the same values as
    a build on the CPU cast after, without the whole layer in fp32 on the host first (at 10^8 labels and fan-in 64,
    25 GB of host memory and as long again to copy it to the GPU)."""
    return _output_rows({"rows_device": device, "rows_dtype": dtype})


def cast_beside_output_rows(model, dtype: torch.dtype):
    """`model.to(dtype)` (a new model takes its encoder's dtype), but for a head and tail built in a dtype of their
    own (`output_rows_on`), which are left as they are rather than cast (and copied whole) twice."""
    layer = model.output_layer
    placed = (OUTPUT_ROWS.get() or {}).get("rows_dtype") is not None
    rows = {name: layer._modules[name] for name in ("head", "tail")} if placed else {}
    layer._modules.update(dict.fromkeys(rows))
    try:
        return model.to(dtype)
    finally:
        layer._modules.update(rows)


def block_seed(seed: int, stream: int, block: int) -> int:
    """A 63-bit seed for block `block` of stream `stream`: splitmix64 over the three, so that nearby triples (seed 0
    and 1, consecutive blocks) give unrelated generators."""
    value = 0
    for part in (seed, stream, block):
        value = (value ^ (part & _MASK)) + 0x9E3779B97F4A7C15 & _MASK
        value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
        value ^= value >> 31
    return value >> 1


@torch.no_grad()
def fill_rows_(out: torch.Tensor, first: int, seed: int, stream: int, draw) -> torch.Tensor:
    """Fills `out` `[n, ...]` with rows `[first, first + n)` of the stream: `draw(generator, rows)` gives a whole
    block's rows (fp32 or int, drawn on the CPU also under a `with torch.device("cuda"):` block, so that every device
    gets the same rows), of which the ones wanted are cast into `out`."""
    stop, rows = first + out.shape[0], INITIAL_BLOCK_ROWS

    def fill_block(block):
        start = block * rows
        generator = torch.Generator(device="cpu").manual_seed(block_seed(seed, stream, block))
        values = draw(generator, rows)
        low, high = max(first, start), min(stop, start + rows)
        with torch.no_grad():  # grad mode is per thread
            out[low - first : high - first].copy_(values[low - start : high - start])

    blocks = range(first // rows, -(-stop // rows))
    # Blocks are independent (a generator each, disjoint rows of `out`) and torch's ops release the GIL: threads
    # draw them in parallel, and the result does not depend on their number. One thread: this one (a new thread
    # takes a malloc arena of its own, which keeps the memory of its transient blocks).
    threads = min(build_threads(), len(blocks))
    if threads <= 1:
        for block in blocks:
            fill_block(block)
        return out
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill_block, blocks))
    return out


def build_threads() -> int:
    """Threads that draw initial rows: this process's share of the cores (torchrun's `LOCAL_WORLD_SIZE` processes
    share the machine; torchrun also sets one intra-op thread a process, which would draw a 10^9-label share of
    rows for half an hour)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def random_supports(
    group_count: int, fan_in: int, in_features: int, seed: int, first_group: int = 0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`[group_count, fan_in]` int32 supports of the groups `[first_group, first_group + group_count)`, each row
    `fan_in` distinct features drawn uniformly (sorted), from `seed` and the group's index alone; into `out` (on any
    device) where given, a block at a time."""

    def draw(generator, rows):
        keys = torch.rand(rows, in_features, generator=generator, device="cpu")
        return keys.topk(fan_in, dim=1, sorted=False).indices.sort(dim=1).values.int()

    out = torch.empty(group_count, fan_in, dtype=torch.int32, device="cpu") if out is None else out
    return fill_rows_(out, first_group, seed, SUPPORTS_STREAM, draw)


def linear_init_std(config) -> float:
    """The std of `PreTrainedModel._init_weights`'s normal initialisation of a linear layer, for `config`."""
    for name in ("initializer_range", "init_std", "initializer_factor"):
        if hasattr(config, name):
            return getattr(config, name) or 0.02
    return getattr(config.get_text_config(), "initializer_range", 0.02)


def _unset(tensor) -> bool:
    """Whether `tensor` is to be initialised: present, not on the meta device, not loaded (transformers' flag)."""
    return tensor is not None and tensor.device.type != "meta" and not getattr(tensor, "_is_hf_initialized", False)


@torch.no_grad()
def initialize_output_rows_(layer, weight_seed: int, head_std: float) -> None:
    """Initialises the head rows `layer.head_rows` and tail groups `layer.tail_groups` that `layer` holds (all of a
    `HasteOutputLayer`, one rank's share of a `ShardedOutputLayer`) as the same rows of the whole layer; leaves
    tensors on the meta device and loaded ones alone."""
    if layer.head is not None:
        first, width = layer.head_rows[0], layer.head.weight.shape[1]
        if _unset(layer.head.weight):
            normal = lambda generator, rows: torch.randn(rows, width, generator=generator, device="cpu").mul_(head_std)  # noqa: E731
            fill_rows_(layer.head.weight, first, weight_seed, HEAD_WEIGHT_STREAM, normal)
        if _unset(layer.head.bias):
            layer.head.bias.zero_()
    if layer.tail is not None:
        first, (_, group_size, fan_in) = layer.tail_groups[0], layer.tail.weight.shape
        bound = 1.0 / math.sqrt(fan_in)

        def uniform(generator, rows):
            return torch.empty(rows, group_size, fan_in, device="cpu").uniform_(-bound, bound, generator=generator)

        if _unset(layer.tail.weight):
            fill_rows_(layer.tail.weight, first, weight_seed, TAIL_WEIGHT_STREAM, uniform)
        if _unset(layer.tail.bias):
            layer.tail.bias.zero_()
        if _unset(layer.tail.supports):
            groups, in_features = layer.tail.supports.shape[0], layer.tail.in_features
            random_supports(groups, fan_in, in_features, layer.supports_seed, first, out=layer.tail.supports)
