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

Memory options (what `haste-hf train` sets with the flags of the same names): by default each is what
`HasteTrainer` chooses for this model, batch and GPU (`haste_hf.training.memory_plan`; `--device-memory-gib N` plans for a
GPU of N GiB), and a flag forces it on or off: `--[no-]gradient-checkpointing` (the encoder recomputes its
activations in the backward; `--checkpoint-every N`: every N-th block only, as
`--gradient_checkpointing_kwargs '{"every_n_layers": N}'`), `--momentum-dtype float32|bfloat16` (the output layer's
SGD momentum, stochastically rounded), `--[no-]chunked-backward` (the loss backward in label chunks, each chunk's
logits recomputed: no stored `[B, L]` logit gradient; chunks of 2^27 logit-gradient elements, 2^20 labels at
batch 128, or `--chunk-labels N`), `--[no-]fused-update` (the head's and tail's SGD step applied chunk by chunk in
the chunked backward: no stored weight gradient); `--options-off` turns every one off (the default before the
plan). Each row names the options it ran with. With the fused update the output layer's step runs inside
"whole step fwd+bwd", so compare "fwd+bwd+optimizer". With either, "output layer fwd+bwd" (materialised
logits, not what training runs) is not measured.
At 10^8 labels (`--labels 100 --variants HASTE`, one H200) only the memory-lean step fits.

Uses only the public API (`model.output_layer.loss`; `fused_loss` on code before it), so the same script times the code
before and after a change: `PYTHONPATH=<other checkout> python benchmarks/step.py` (with `--options-off`, or every
option forced, on code of the same layout before `haste_hf.training.memory_plan`).

    python benchmarks/step.py --title "after (commit abc1234)" --out results/step_h100.md
    python benchmarks/step.py --labels 8.6 --variants HASTE --gradient-checkpointing --momentum-dtype bfloat16 --fused-update
"""

import argparse
import copy
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
        tail_bias=args.tail_bias,
    )
    with torch.device("cuda"):
        model = HasteForExtremeClassification(config)
    if args.sdpa_attention:
        from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

        for module in model.modules():
            if isinstance(module, MPNetSelfAttention):
                module.forward = functools.partial(mpnet_sdpa_attention, module)
    for module in (output_layer_of(model).head, output_layer_of(model).tail):
        if module is not None:
            module.to(torch.bfloat16)
    return model.train()


def resolve_options(model, args) -> None:
    """The memory options not forced by a flag, as `HasteTrainer` chooses them for this model, batch and GPU
    (`haste_hf.training.memory_plan`; `--device-memory-gib` plans for a smaller GPU); checkpointing applied to `model`."""
    if (args.gradient_checkpointing, args.momentum_dtype, args.chunked_backward, args.fused_update).count(None):
        from haste_hf.training.memory_plan import plan_memory
        from haste_hf.training.training_args import HasteTrainingArguments

        forced = {
            "output_momentum_dtype": args.momentum_dtype,
            "output_chunked_backward": args.chunked_backward,
            "output_fused_update": args.fused_update,
            "gradient_checkpointing": args.gradient_checkpointing,
        }
        training = HasteTrainingArguments(
            output_dir="step-benchmark",
            output_layer_dtype="bfloat16",  # as `build` casts it; bf16 autocast wherever the GPU has it
            per_device_train_batch_size=args.batch,
            report_to=[],
            **{name: value for name, value in forced.items() if value is not None},
        )
        device_memory = (
            int(args.device_memory_gib * 2**30)
            if args.device_memory_gib
            else torch.cuda.get_device_properties(0).total_memory
        )
        plan = plan_memory(training, model, tokens=args.tokens, sharded=False, device_memory=device_memory)
        args.momentum_dtype = plan.output_momentum_dtype
        args.chunked_backward = plan.output_chunked_backward
        args.fused_update = plan.output_fused_update
        if plan.checkpoint_every is not None:
            args.gradient_checkpointing = plan.checkpoint_every > 0
            args.checkpoint_every = plan.checkpoint_every or 1
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(every_n_layers=args.checkpoint_every or 1)


def mpnet_sdpa_attention(
    self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs
):
    """`MPNetSelfAttention.forward` through `scaled_dot_product_attention`, the relative-position bias and the padding
    mask as its additive mask: the same attention (tests/test_step_benchmark.py), but the `[B, heads, T, T]` scores,
    fp32 probabilities and dropout mask the eager forward keeps for the backward are not stored (the kernel keeps
    the bf16 bias only). transformers' MPNet has no SDPA path of its own (transformers 5.10 to 5.24)."""
    shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
    q, k, v = (projection(hidden_states).view(shape).transpose(1, 2) for projection in (self.q, self.k, self.v))
    biases = [bias for bias in (position_bias, attention_mask) if bias is not None]
    mask = None if not biases else sum(biases[1:], biases[0]).to(q.dtype)
    dropout = self.dropout.p if self.training else 0.0
    context = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    return (self.o(context.transpose(1, 2).reshape(*hidden_states.shape[:-1], self.all_head_size)),)


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
    args = copy.copy(args)  # each variant and label count gets its own choice
    resolve_options(model, args)
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
    row["options"] = options(args)
    return row


def options(args) -> str:
    chosen = [
        (
            "gradient checkpointing"
            + (f", every {args.checkpoint_every}-th block" if (args.checkpoint_every or 1) > 1 else "")
        )
        if args.gradient_checkpointing
        else None,
        f"{args.momentum_dtype} momentum",
        f"chunked loss backward ({f'{args.chunk_labels:,} labels' if args.chunk_labels else '2^27 elements'} a chunk)"
        if args.chunked_backward or args.fused_update
        else None,
        "fused update" if args.fused_update else None,
    ]
    chosen.append("SDPA attention" if args.sdpa_attention else None)
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
    parser.add_argument(
        "--tail-bias", action="store_true", help="a bias per tail label (the recipe's default since issue 39)"
    )
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    # Each memory option: the trainer's own choice (haste_hf.training.memory_plan) unless a flag forces it on or off.
    on_off = argparse.BooleanOptionalAction
    parser.add_argument("--gradient-checkpointing", action=on_off, help="the encoder recomputes its activations")
    parser.add_argument(
        "--checkpoint-every", type=int, default=None, help="checkpoint every N-th encoder block only (forces it on)"
    )
    parser.add_argument("--momentum-dtype", choices=["float32", "bfloat16"], help="output layer's SGD momentum")
    parser.add_argument("--chunked-backward", action=on_off, help="loss backward in label chunks (no [B, L] gradient)")
    parser.add_argument(
        "--chunk-labels", type=int, default=0, help="labels per chunk (0: 2^27 logit-gradient elements)"
    )
    parser.add_argument("--fused-update", action=on_off, help="output layer's SGD step fused into the loss backward")
    parser.add_argument(
        "--options-off",
        action="store_true",
        help="every memory option no flag forces off (fp32 momentum, no chunks, no fused update, no checkpointing)",
    )
    parser.add_argument(
        "--device-memory-gib",
        type=float,
        default=None,
        help="plan the options for a GPU of this size (default: this one)",
    )
    parser.add_argument(
        "--sdpa-attention",
        action="store_true",
        help="MPNet's attention through scaled_dot_product_attention (not in the product yet: measured here first)",
    )
    parser.add_argument("--no-flops-matched", action="store_true", help="skip the FLOPs-matched GEMMs ([B, L] buffers)")
    parser.add_argument("--title", default="", help="first line of the table (e.g. the code's commit)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args(argv)
    if args.checkpoint_every is not None and args.gradient_checkpointing is None:
        args.gradient_checkpointing = True
    if args.options_off:  # those no flag forces
        for name in ("gradient_checkpointing", "chunked_backward", "fused_update"):
            setattr(args, name, False if getattr(args, name) is None else getattr(args, name))
        args.momentum_dtype = args.momentum_dtype or "float32"
    if hasattr(modeling_haste, "random_supports"):
        modeling_haste.random_supports = supports_on_cpu(modeling_haste.random_supports)
    lines = [
        f"{args.title}: {torch.cuda.get_device_name()}, torch {torch.__version__}, B = {args.batch}, "
        f"{args.tokens} tokens, G = {args.group_size}, F = {args.fan_in}, head {args.head_fraction:.0%}, "
        f"median ms of CUDA events ({args.repeats} runs); memory options per row (chosen by haste_hf.training.memory_plan "
        "unless forced by a flag)",
        "",
        "| labels | variant | encoder fwd+bwd | output layer fwd+bwd | output layer + loss | whole step fwd+bwd "
        "| optimizer step | fwd+bwd+optimizer | peak train GiB | predict_topk texts/s | flops-matched sum "
        "| output+loss / step | output+loss / flops-matched | memory options |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
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
                f"| {matched:.2f} | {row['output_loss'] / row['step']:.0%} | {row['output_loss'] / matched:.1f}x "
                f"| {row['options']} |"
            )
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
