# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""Whether several GPUs will train faster than one (issue 42).

Each data-parallel step pays a cost one GPU does not: the encoder's gradients are all-reduced, the ranks wait for
one another, the sharded output layer exchanges the batch's features and scores. Its gain is the step's work split
over the GPUs. The work a GPU does in a step grows with its texts and the labels it scores for each: the per-GPU batch
times the labels a GPU holds (all of them replicated, its share sharded). Measured with MiniLM- and MPNet-sized
encoders on H100 / H200:
- `deps` (43,054 labels, replicated), 32 texts a GPU on 4 GPUs: 32 x 43,054 = 1.4M text-labels a GPU a step, and
  four GPUs trained slower than one (over 240 s against about 150 s);
- the 8.6M-label scale data, sharded, 128 texts a GPU on 4: 128 x 2.16M = 276M text-labels a GPU a step, 4.24x one
  GPU's speed.
Below `SLOW_TEXT_LABELS`, ten times the first, the run is told that one GPU is likely as fast (one line, from the
main process: `HasteTrainer` logs it).
"""

# Text-labels a GPU scores in a step below which the data-parallel overhead of a step outweighs its gain.
SLOW_TEXT_LABELS = 14_000_000


def multi_gpu_advice(label_count: int, per_device_batch: int, world_size: int, sharded: bool) -> str | None:
    """One line saying that `world_size` GPUs will likely train slower than one, with the reason, or None."""
    if world_size <= 1:
        return None
    labels_per_gpu = label_count // world_size if sharded else label_count
    work = per_device_batch * labels_per_gpu
    if work >= SLOW_TEXT_LABELS:
        return None
    return (
        f"{world_size} processes will likely train slower than one: each scores {per_device_batch} texts x "
        f"{labels_per_gpu:,} labels = {work / 1e6:.1f}M text-labels a step, under the {SLOW_TEXT_LABELS / 1e6:.0f}M "
        "where the per-step synchronisation of the GPUs outweighs the work it splits (measured: 43K labels at 32 "
        "texts a GPU trained slower on 4 GPUs than on one); train on one GPU, or raise --per-device-train-batch-size."
    )
