# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The memory plan of one rank of a sharded run at any label count, without a GPU: what `HasteTrainer` would plan
for `haste-hf train` on GPUS processes (the output layer sharded by labels), its terms, and what it chose.

A rank's share is built on the meta device (no memory) with the share's shapes: 1/GPUS of the dense head's rows and
of the tail's groups, in bf16 (what a GPU with bf16 trains in); the encoder whole (MiniLM-L6 by default, the
recipe's encoder). Defaults are the recipe's: G 16, F 128, head 3%, batch 128 of 128 tokens a GPU, momentum 0.9.

    python benchmarks/memory_plan_at.py --labels 1e9 --gpus 4 [--fan-in 64] [--output-momentum 0]
"""

import argparse
import dataclasses
import math
import types

import torch
from transformers import BertConfig

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.modeling.configuration_haste import (
    DEFAULT_FAN_IN,
    DEFAULT_GROUP_SIZE,
    DEFAULT_HEAD_LABEL_FRACTION,
    head_label_count_for,
)
from haste_hf.modeling.defaults import DEFAULT_BATCH_SIZE, DEFAULT_MAX_LENGTH
from haste_hf.training import memory_plan
from haste_hf.training.training_args import HasteTrainingArguments


# sentence-transformers/all-MiniLM-L6-v2's encoder (the recipe's default), without downloading its config.
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
H100_BYTES = 85_031_714_816  # torch.cuda.get_device_properties(0).total_memory of an H100 80GB HBM3


def share_model(labels: int, gpus: int, group_size: int, fan_in: int, head_fraction: float):
    """A model (meta device) whose output layer has the shapes of rank 0's share (the largest) of `labels`."""
    head = head_label_count_for(head_fraction, labels)
    groups = math.ceil((labels - head) / group_size)
    head_share, group_share = math.ceil(head / gpus), math.ceil(groups / gpus)
    config = HasteConfig(
        encoder=BertConfig(**MINILM),
        label_count=head_share + group_share * group_size,
        head_label_count=head_share,
        group_size=group_size,
        fan_in=fan_in,
    )
    with torch.device("meta"):
        model = HasteForExtremeClassification(config)
    for module in (model.output_layer.head, model.output_layer.tail):
        module.to(torch.bfloat16)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=float, default=1e9)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE)
    parser.add_argument("--fan-in", type=int, default=DEFAULT_FAN_IN)
    parser.add_argument("--head-fraction", type=float, default=DEFAULT_HEAD_LABEL_FRACTION)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH)
    parser.add_argument("--output-momentum", type=float, default=0.9)
    parser.add_argument("--device-memory-gib", type=float, default=H100_BYTES / 2**30)
    options = parser.parse_args(argv)
    labels = int(options.labels)
    model = share_model(labels, options.gpus, options.group_size, options.fan_in, options.head_fraction)
    defaults = HasteTrainingArguments(output_dir="unused", use_cpu=True, report_to="none")
    fields = {field.name: getattr(defaults, field.name) for field in dataclasses.fields(defaults)}
    fields.update(
        _checkpointing_given=False,
        world_size=options.gpus,
        bf16=True,
        output_layer_dtype="bfloat16",
        per_device_train_batch_size=options.batch_size,
        output_momentum=options.output_momentum,
    )
    args = types.SimpleNamespace(**fields)
    device_memory = int(options.device_memory_gib * 2**30)
    plan = memory_plan.plan_memory(args, model, tokens=options.max_length, sharded=True, device_memory=device_memory)
    layer = model.output_layer
    weights = sum(p.numel() * p.element_size() for p in (layer.head.weight, layer.tail.weight))
    momentum = (
        sum(p.numel() for p in (layer.head.weight, layer.tail.weight))
        * (2 if plan.output_momentum_dtype == "bfloat16" else 4)
        * (options.output_momentum > 0)
    )
    buffers = memory_plan.output_buffer_bytes(layer, sharded=True)
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    print(
        f"{labels:,} labels on {options.gpus} GPUs (G {options.group_size}, F {options.fan_in}, head "
        f"{options.head_fraction:.0%}; rank 0's share: {layer.head_label_count:,} head rows, {layer.tail_group_count:,} "
        f"tail groups), MiniLM-L6, batch {options.batch_size} x {options.max_length} a GPU, momentum "
        f"{options.output_momentum}, a GPU of {options.device_memory_gib:.1f} GiB:"
    )
    print(
        f"  output weights (bf16) {gib(weights)}; momentum {gib(momentum)}; supports (int32) "
        f"{gib(layer.tail.supports.numel() * 4)}; label ids (int64) {gib(layer.output_labels.numel() * 8)}; id lookup "
        f"(2 x int32) {gib(buffers - layer.tail.supports.numel() * 4 - layer.output_labels.numel() * 8)}"
    )
    print(f"  {memory_plan.describe(plan, True)}")
    fits = plan.planned_peak <= memory_plan.DEVICE_MEMORY_SHARE * device_memory
    print(f"  planned peak {gib(plan.planned_peak)}: {'fits' if fits else 'does NOT fit'}")


if __name__ == "__main__":
    main()
