# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`predict_top_k` (what `haste-hf evaluate` and `predict` score with) path by path, side by side in one run: the
texts tokenised a batch of `--batch-size` texts at a time by the tokenizer's own call (the path before issue 37's
work, and still the one of a tokenizer without a Rust backend), against the token-chunk path (chunks tokenised
ahead, batches of `batch_size x max_length` padded tokens, at least 65,536 on a GPU, padding gathered on the
device); each with and without bf16 autocast of the encoder on a GPU with bf16.

A HASTE model over `--encoder` (its weights as saved: float32) with `--labels` labels (G = 16, F = `--fan-in`, head
3%; the output layer in bf16 on a GPU, as `train` saves it), random rows; `--texts` titles of 5 to 60 words drawn
from the tokenizer's whole-word vocabulary. Each row: texts/s over the whole call (after one warm-up call on 256
texts), and the share of top-1 labels equal to the first row's (float32 rows agree to rounding).

    python benchmarks/predict_path.py --encoder /tmp/minilm --labels 100000 --texts 4000
    python benchmarks/predict_path.py --encoder /tmp/minilm --labels 8600000 --texts 50000 --out predict_path.md
"""

import argparse
import os
import sys
import time
from pathlib import Path


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != HERE]  # its kernels.py shadows `kernels`


def titles(tokenizer, count: int, seed: int) -> list[str]:
    import numpy as np

    words = [word for word in tokenizer.get_vocab() if word.isalpha() and word.isascii() and len(word) > 2]
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(5, 61))) for _ in range(count)]


def build(encoder: str, labels: int, fan_in: int, device):
    import torch

    from haste_hf import HasteForExtremeClassification
    from haste_hf.modeling.initialization import output_rows_on

    # The head and tail built where and in the dtype they are scored in, as `train` builds them.
    with output_rows_on(device, torch.bfloat16 if device.type == "cuda" else None):
        model = HasteForExtremeClassification.from_encoder_pretrained(
            encoder, label_count=labels, head_label_fraction=0.03, group_size=16, fan_in=fan_in
        )
    return model.to(device).eval()


def run(args) -> list[dict]:
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from haste_hf import evaluation
    from haste_hf.labels import token_batches

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = AutoTokenizer.from_pretrained(args.encoder)
    model = build(args.encoder, args.labels, args.fan_in, device)
    texts = titles(tokenizer, args.texts, args.seed)
    fast_backend, has_bf16 = token_batches.fast_backend, evaluation._has_bf16
    variants = [("per-batch tokenizer (before)", False, False), ("token chunks", True, False)]
    if device.type == "cuda" and has_bf16(device):
        variants += [("per-batch tokenizer, bf16 autocast", False, True), ("token chunks, bf16 autocast", True, True)]
    rows, first = [], None
    for name, chunks, autocast in variants:
        token_batches.fast_backend = fast_backend if chunks else (lambda tokenizer, max_length: None)
        evaluation._has_bf16 = lambda device, autocast=autocast: autocast
        try:
            evaluation.predict_top_k(model, tokenizer, texts[:256], 5, args.batch_size, args.max_length)
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            ids, _ = evaluation.predict_top_k(model, tokenizer, texts, 5, args.batch_size, args.max_length)
            seconds = time.perf_counter() - started
        finally:
            token_batches.fast_backend, evaluation._has_bf16 = fast_backend, has_bf16
        first = ids if first is None else first
        agree = float(np.mean(ids[:, 0] == first[:, 0]))
        rows.append({"path": name, "seconds": seconds, "texts_per_second": len(texts) / seconds, "top1_agree": agree})
        print(f"{name}: {len(texts) / seconds:,.0f} texts/s ({seconds:.2f} s), top-1 as the first row's: {agree:.4f}")
    return rows


def table(args, rows: list[dict], device_name: str) -> str:
    lines = [
        f"# predict_top_k paths: {args.texts:,} titles, {args.labels:,} labels (F = {args.fan_in}), {device_name}, "
        f"batch_size {args.batch_size}, max_length {args.max_length}, encoder {args.encoder}",
        "",
        "| path | wall s | texts/s | vs the first row | top-1 as the first row's |",
        "|---|---|---|---|---|",
    ]
    base = rows[0]["texts_per_second"]
    for row in rows:
        lines.append(
            f"| {row['path']} | {row['seconds']:.2f} | {row['texts_per_second']:,.0f} | "
            f"{row['texts_per_second'] / base:.2f}x | {row['top1_agree']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder", required=True, help="A transformers encoder folder or Hub id (with tokenizer).")
    parser.add_argument("--labels", type=int, default=100_000)
    parser.add_argument("--fan-in", type=int, default=128)
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64, help="`eval_batch_size` (the CLI's default: 64).")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--device", help="cuda or cpu (default: cuda where there is one).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="Also write the table to this file.")
    args = parser.parse_args(argv)
    import torch

    rows = run(args)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device_name = torch.cuda.get_device_name() if cuda else f"CPU ({torch.get_num_threads()} threads)"
    text = table(args, rows, device_name)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
