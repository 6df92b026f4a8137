# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""CPU serving of a trained HASTE model: PyTorch eager against onnxruntime, fp32 and with an int8 encoder.

For each variant: P@1/3/5 on the test split of the demo set (or `--data`), then texts/s and per-call latency
(p50 / p95) at batch 1 and batch 32, and the ratios to PyTorch eager, in one table. The variants are

  pytorch      `model.predict_topk` (torch eager, float32)
  onnx         `haste-hf export` (one graph: encoder, pooling, output layer, top-k) on onnxruntime
  onnx-int8    the same with the encoder's matmuls quantized to int8 (`--quantize`, dynamic quantization)

Timings cover the model call alone (texts are tokenized beforehand, as every variant needs it), with the same
padded batches for every variant. The variants are timed in turns, batch by batch, so that a change in the
machine's load falls on all of them alike. Every variant uses `--threads` threads (default: all cores).

    python benchmarks/serving.py                       # trains the demo model first (`haste-hf demo`)
    python benchmarks/serving.py --model haste-demo --out results/serving_cpu.md
"""

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np


KS = (1, 3, 5)
BATCH_SIZES = (1, 32)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=None, help="A trained model folder (default: train the demo model into --work-dir)."
    )
    parser.add_argument(
        "--data", default=None, help="Dataset folder (default: the model's training data settings on the demo set)."
    )
    parser.add_argument(
        "--work-dir", default=None, help="Where the demo model and the exports go (default: a temporary folder)."
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="Threads of torch and onnxruntime.")
    parser.add_argument(
        "--calls",
        type=int,
        nargs=2,
        default=(200, 30),
        metavar=("B1", "B32"),
        help="Timed calls per variant at batch 1 and at batch 32 (after 5 warm-up calls).",
    )
    parser.add_argument("--out", default=None, help="Also write the table (markdown) to this file.")
    return parser.parse_args(argv)


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def demo_model(work_dir: Path) -> Path:
    from haste_hf.cli import main

    output = work_dir / "haste-demo"
    if main(["demo", "--output-dir", str(output)]) != 0:
        raise SystemExit("training the demo model failed")
    return output


def variants(model_dir: Path, work_dir: Path, threads: int) -> dict:
    """name -> `call(input_ids, attention_mask) -> top-5 label ids`, and the size of each variant's files."""
    import onnxruntime
    import torch

    from haste_hf import HasteForExtremeClassification
    from haste_hf.export import export_onnx
    from haste_hf.onnx_serving import OnnxClassifier

    torch.set_num_threads(threads)
    model = HasteForExtremeClassification.from_pretrained(model_dir, dtype=torch.float32).eval()

    def eager(input_ids, attention_mask):
        with torch.inference_mode():
            return model.predict_topk(
                torch.from_numpy(input_ids), torch.from_numpy(attention_mask), k=max(KS)
            ).label_ids.numpy()

    calls = {"pytorch": eager}
    sizes = {"pytorch": (model_dir / "model.safetensors").stat().st_size}
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    for name, quantize in (("onnx", False), ("onnx-int8", True)):
        folder = work_dir / name
        started = time.perf_counter()
        export_onnx(str(model_dir), folder, top_k=max(KS), quantize=quantize, overwrite=True)
        print(f"exported {name} in {time.perf_counter() - started:.0f} s")
        classifier = OnnxClassifier(folder, session_options=options)
        calls[name] = lambda input_ids, attention_mask, classifier=classifier: classifier.top_k(
            input_ids, attention_mask
        )[0]
        sizes[name] = (folder / "model.onnx").stat().st_size
    return calls, sizes


def tokenized_batches(tokenizer, texts, batch_size):
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], truncation=True, padding=True, return_tensors="np")
        yield batch["input_ids"].astype(np.int64), batch["attention_mask"].astype(np.int64)


def precision(calls, batches, labels) -> dict:
    from haste_hf.metrics import compute_xmc_metrics

    results = {}
    for name, call in calls.items():
        top = np.concatenate([call(*batch) for batch in batches])
        metrics = compute_xmc_metrics(top, labels, ks=KS)
        results[name] = [metrics[f"P@{k}"] for k in KS]
    return results


def latency(calls, batches, call_count: int, warmup: int = 5) -> dict:
    """Per variant: (texts/s, p50 ms, p95 ms) over `call_count` calls, the variants taking turns call by call."""
    seconds = {name: [] for name in calls}
    texts = {name: 0 for name in calls}
    for index in range(warmup + call_count):
        input_ids, attention_mask = batches[index % len(batches)]
        for name, call in calls.items():
            started = time.perf_counter()
            call(input_ids, attention_mask)
            elapsed = time.perf_counter() - started
            if index >= warmup:
                seconds[name].append(elapsed)
                texts[name] += len(input_ids)
    return {
        name: (texts[name] / sum(times), 1e3 * np.percentile(times, 50), 1e3 * np.percentile(times, 95))
        for name, times in seconds.items()
    }


def table(precisions, timings, sizes) -> str:
    header = ["variant", "P@1", "P@3", "P@5", "size MB"]
    for batch_size in BATCH_SIZES:
        header += [
            f"b{batch_size} texts/s",
            f"b{batch_size} p50 ms",
            f"b{batch_size} p95 ms",
            f"b{batch_size} speed-up",
        ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in precisions:
        row = [name, *(f"{100 * p:.2f}" for p in precisions[name]), f"{sizes[name] / 1e6:.1f}"]
        for batch_size in BATCH_SIZES:
            per_second, p50, p95 = timings[batch_size][name]
            speedup = per_second / timings[batch_size]["pytorch"][0]
            row += [f"{per_second:,.1f}", f"{p50:.2f}", f"{p95:.2f}", f"{speedup:.2f}x"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    import onnxruntime
    import torch
    import transformers
    from transformers import AutoTokenizer

    from haste_hf import HasteForExtremeClassification
    from haste_hf.evaluation import saved_evaluation_settings
    from haste_hf.recipe import load_dataset

    with tempfile.TemporaryDirectory() as scratch:
        work_dir = Path(args.work_dir or scratch)
        work_dir.mkdir(parents=True, exist_ok=True)
        model_dir = Path(args.model) if args.model else demo_model(work_dir)
        settings = saved_evaluation_settings(model_dir)
        data = load_dataset(args.data, settings.get("format", "auto"), settings.get("text_fields"))
        if data.label_count != HasteForExtremeClassification.config_class.from_pretrained(model_dir).label_count:
            raise SystemExit(
                f"{model_dir} was not trained on {args.data or 'the demo set'} (another label count): pass --data"
            )
        test = data.splits["test"]
        texts, labels = list(test["text"]), list(test["labels"])
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        calls, sizes = variants(model_dir, work_dir, args.threads)
        precisions = precision(calls, list(tokenized_batches(tokenizer, texts, 32)), labels)
        timings = {
            batch_size: latency(calls, list(tokenized_batches(tokenizer, texts, batch_size)), call_count)
            for batch_size, call_count in zip(BATCH_SIZES, args.calls)
        }
    setup = (
        f"{cpu_name()}, {os.cpu_count()} cores, {args.threads} thread(s); "
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, transformers {transformers.__version__}; "
        f"{len(texts)} test texts of {model_dir}, max_length {tokenizer.model_max_length}; "
        f"timed calls: {args.calls[0]} at batch 1, {args.calls[1]} at batch 32"
    )
    report = f"{setup}\n\n{table(precisions, timings, sizes)}\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)


if __name__ == "__main__":
    main()
