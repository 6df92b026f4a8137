# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""One training step of HASTE and of a dense output layer at millions of labels, part by part.

An MPNet-base-sized encoder (12 layers, hidden 768, random init), batch 128 of 128 tokens, bf16 autocast
with a bf16 output layer (what `haste-hf train --bf16` sets), G = 32, F = 64, head 3% for HASTE; Dense puts
every label in the dense head. Per variant and label count, median ms of CUDA events:

- encoder fwd+bwd: `encode` and the backward of its pooled output;
- output layer fwd+bwd: head and tail logits over all positions and their backward (no loss);
- output layer + loss: the same with the loss, from the pooled output (what training runs);
- whole step fwd+bwd: `model(..., labels=...)` and `loss.backward()`;
- optimizer step: AdamW on the encoder side, SGD with momentum (stochastic rounding) on the output layer,
  as `HasteTrainer` builds them;
- peak train GiB: `torch.cuda.max_memory_allocated` over a full step (forward, backward, optimizer) once
  the optimizer states exist;
- predict_topk texts/s: `predict_topk(k=5)` on batches of 256;
- flops-matched: the three cuBLAS passes of a dense layer of the same FLOPs as the tail
  (X [B, F] x W [L, F]^T, forward, weight gradient, feature gradient), summed.

Memory options (what `haste-hf train` sets with the flags of the same names): `--gradient-checkpointing`
(the encoder recomputes its activations in the backward; `--checkpoint-every N`: every N-th block only, as
`--gradient_checkpointing_kwargs '{"every_n_layers": N}'`), `--momentum-dtype bfloat16` (the output layer's
SGD momentum, stochastically rounded), `--chunked-backward` (the loss backward in label chunks, each chunk's
logits recomputed: no stored `[B, L]` logit gradient; chunks of 2^27 logit-gradient elements, 2^20 labels at
batch 128, or `--chunk-labels N`), `--fused-update` (the head's and tail's SGD step applied chunk by chunk in
the chunked backward: no stored weight gradient). With the fused update the output layer's step runs inside
"whole step fwd+bwd", so compare "fwd+bwd+optimizer". With either, "output layer fwd+bwd" (materialised
logits, not what training runs) is not measured.
At 10^8 labels (`--labels 100 --variants HASTE`, one H200) only the memory-lean step fits.

Uses only the public API (`model.output_layer.loss`; `fused_loss` on code before it), so the same script times the code
before and after a change: `PYTHONPATH=<other checkout> python benchmarks/step.py`.

    python benchmarks/step.py --title "after (commit abc1234)" --out results/step_h100.md
    python benchmarks/step.py --labels 8.6 --variants HASTE --gradient-checkpointing --momentum-dtype bfloat16 --fused-update
"""

import argparse
import functools
import gc
import statistics

import torch
from transformers import MPNetConfig

from haste_hf import HasteConfig, HasteForExtremeClassification
from haste_hf.modeling import modeling_haste
from haste_hf.training.optimization import HasteOptimizer, StochasticRoundingSGD
from haste_hf.training.trainer import split_parameters


def cuda_ms(fn, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def supports_on_cpu(original):
    """Code from before issue #11 could not draw supports under a CUDA default device: draw them on the CPU."""

    def draw(*args, **kwargs):
        with torch.device("cpu"):
            return original(*args, **kwargs)

    return draw


def build(variant: str, label_count: int, args) -> HasteForExtremeClassification:
    encoder = MPNetConfig(
        vocab_size=30527, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    )
    head = label_count if variant == "Dense" else round(args.head_fraction * label_count)
    config = HasteConfig(
        encoder=encoder,
        label_count=label_count,
        head_label_count=head,
        group_size=args.group_size,
        fan_in=args.fan_in,
    )
    with torch.device("cuda"):
        model = HasteForExtremeClassification(config)
    for module in (output_layer_of(model).head, output_layer_of(model).tail):
        if module is not None:
            module.to(torch.bfloat16)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(every_n_layers=args.checkpoint_every)
    return model.train()


def output_layer_of(model):
    """The model's output layer (`model.output_layer`; before issue #24 the model held head and tail itself)."""
    return getattr(model, "output_layer", model)


def random_labels(batch_size: int, label_count: int, positives: int, generator) -> torch.Tensor:
    """Padded positive ids: 1..positives per example (ragged), -100 padding."""
    labels = torch.randint(0, label_count, (batch_size, positives), generator=generator)
    counts = torch.randint(1, positives + 1, (batch_size, 1), generator=generator)
    return labels.masked_fill(torch.arange(positives) >= counts, -100).cuda()


def flops_matched_ms(batch_size: int, label_count: int, fan_in: int, args) -> float:
    x = torch.randn(batch_size, fan_in, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(label_count, fan_in, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(batch_size, label_count, device="cuda", dtype=torch.bfloat16)
    total = cuda_ms(lambda: x @ w.t(), args.warmup, args.repeats)
    total += cuda_ms(lambda: grad.t() @ x, args.warmup, args.repeats)
    total += cuda_ms(lambda: grad @ w, args.warmup, args.repeats)
    return total


def bench(variant: str, label_count: int, args) -> dict:
    generator = torch.Generator().manual_seed(0)
    model = build(variant, label_count, args)
    B, T = args.batch, args.tokens
    input_ids = torch.randint(5, 30527, (B, T), generator=generator).cuda()
    attention_mask = torch.ones(B, T, dtype=torch.long, device="cuda")
    labels = random_labels(B, label_count, args.positives, generator)
    encoder_side, output_layer = split_parameters(model)
    output_optimizer = StochasticRoundingSGD(
        output_layer, lr=0.1, momentum=0.9, weight_decay=1e-4, momentum_dtype=getattr(torch, args.momentum_dtype)
    )
    optimizer = HasteOptimizer(
        torch.optim.AdamW([p for _, p in encoder_side], lr=1e-4, weight_decay=0.01), output_optimizer
    )
    lean = args.chunked_backward or args.fused_update
    if lean:  # as `HasteTrainer` sets them
        from haste_hf.modeling.losses import chunk_loss_backward_

        for param in output_layer:
            if param.dim() >= 2:
                update = functools.partial(output_optimizer.update_rows_, param) if args.fused_update else None
                chunk_loss_backward_(param, args.chunk_labels, update)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16)
    row = {}

    def encoder_pass():
        with autocast:
            pooled, _ = model.encode(input_ids, attention_mask)
        pooled.backward(pooled_grad)

    with autocast:
        pooled_shape = model.encode(input_ids, attention_mask)[0]
    pooled_grad = torch.randn_like(pooled_shape)
    pooled = torch.randn_like(pooled_shape).requires_grad_()
    del pooled_shape
    row["encoder"] = cuda_ms(encoder_pass, args.warmup, args.repeats)

    layer = output_layer_of(model)
    row["output"] = float("nan")
    if not lean:
        positions = model.config.head_label_count + (layer.tail.out_features if layer.tail is not None else 0)
        logits_grad = torch.randn(B, positions, device="cuda", dtype=torch.bfloat16)

        def output_layer_pass():
            with autocast:
                logits = layer.position_logits(pooled)
            logits.backward(logits_grad)

        row["output"] = cuda_ms(output_layer_pass, args.warmup, args.repeats)
        logits_grad = None  # released; rebound, not deleted, as the closures above name it

    def output_layer_loss_pass():
        with autocast:
            if layer is not model:
                loss = layer.loss(pooled, labels)
            elif hasattr(model, "fused_loss"):
                loss = model.fused_loss(*model._branch_inputs(pooled), labels)
            else:
                loss = model.compute_loss(model.position_logits(pooled), labels)
        loss.backward()

    row["output_loss"] = cuda_ms(output_layer_loss_pass, args.warmup, args.repeats)
    optimizer.zero_grad(set_to_none=True)  # the passes' gradients are not the step's

    def step_pass():
        with autocast:
            loss = model(input_ids, attention_mask, labels=labels).loss
        loss.backward()

    row["step"] = cuda_ms(step_pass, args.warmup, args.repeats)
    row["optimizer"] = cuda_ms(optimizer.step, 1, args.repeats)

    def full_step():
        optimizer.zero_grad(set_to_none=True)
        step_pass()
        optimizer.step()

    full_step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    full_step()
    torch.cuda.synchronize()
    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    optimizer.zero_grad(set_to_none=True)
    optimizer = pooled = pooled_grad = None

    model.eval()
    predict_ids = torch.randint(5, 30527, (args.predict_batch, T), generator=generator).cuda()
    predict_mask = torch.ones_like(predict_ids)

    def predict():
        with autocast:
            model.predict_topk(predict_ids, predict_mask, k=5)

    row["predict"] = args.predict_batch / (cuda_ms(predict, args.warmup, args.repeats) / 1e3)
    model = None
    gc.collect()
    torch.cuda.empty_cache()
    return row


def options(args) -> str:
    chosen = [
        ("gradient checkpointing" + (f", every {args.checkpoint_every}-th block" if args.checkpoint_every > 1 else ""))
        if args.gradient_checkpointing
        else None,
        f"{args.momentum_dtype} momentum",
        f"chunked loss backward ({f'{args.chunk_labels:,} labels' if args.chunk_labels else '2^27 elements'} a chunk)"
        if args.chunked_backward or args.fused_update
        else None,
        "fused update" if args.fused_update else None,
    ]
    return ", ".join(option for option in chosen if option)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=float, nargs="+", default=[0.67, 2.8, 8.6], help="millions")
    parser.add_argument("--variants", nargs="+", default=["HASTE", "Dense"], choices=["HASTE", "Dense"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--predict-batch", type=int, default=256)
    parser.add_argument("--positives", type=int, default=16, help="at most this many positives per example")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--fan-in", type=int, default=64)
    parser.add_argument("--head-fraction", type=float, default=0.03)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="the encoder recomputes its activations")
    parser.add_argument("--checkpoint-every", type=int, default=1, help="checkpoint every N-th encoder block only")
    parser.add_argument(
        "--momentum-dtype", default="float32", choices=["float32", "bfloat16"], help="output layer's SGD momentum"
    )
    parser.add_argument(
        "--chunked-backward", action="store_true", help="loss backward in label chunks (no [B, L] gradient)"
    )
    parser.add_argument(
        "--chunk-labels", type=int, default=0, help="labels per chunk (0: 2^27 logit-gradient elements)"
    )
    parser.add_argument(
        "--fused-update", action="store_true", help="output layer's SGD step fused into the loss backward"
    )
    parser.add_argument("--no-flops-matched", action="store_true", help="skip the FLOPs-matched GEMMs ([B, L] buffers)")
    parser.add_argument("--title", default="", help="first line of the table (e.g. the code's commit)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if hasattr(modeling_haste, "random_supports"):
        modeling_haste.random_supports = supports_on_cpu(modeling_haste.random_supports)
    lines = [
        f"{args.title}: {torch.cuda.get_device_name()}, torch {torch.__version__}, B = {args.batch}, "
        f"{args.tokens} tokens, G = {args.group_size}, F = {args.fan_in}, head {args.head_fraction:.0%}, "
        f"median ms of CUDA events ({args.repeats} runs); options: {options(args)}",
        "",
        "| labels | variant | encoder fwd+bwd | output layer fwd+bwd | output layer + loss | whole step fwd+bwd "
        "| optimizer step | fwd+bwd+optimizer | peak train GiB | predict_topk texts/s | flops-matched sum "
        "| output+loss / step | output+loss / flops-matched |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for millions in args.labels:
        label_count = int(millions * 1e6)
        matched = (
            float("nan") if args.no_flops_matched else flops_matched_ms(args.batch, label_count, args.fan_in, args)
        )
        for variant in args.variants:
            row = bench(variant, label_count, args)
            line = (
                f"| {millions}M | {variant} | {row['encoder']:.1f} | {row['output']:.1f} | {row['output_loss']:.1f} "
                f"| {row['step']:.1f} | {row['optimizer']:.1f} | {row['step'] + row['optimizer']:.1f} | {row['peak_gib']:.1f} "
                f"| {row['predict']:,.0f} "
                f"| {matched:.2f} | {row['output_loss'] / row['step']:.0%} | {row['output_loss'] / matched:.1f}x |"
            )
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
