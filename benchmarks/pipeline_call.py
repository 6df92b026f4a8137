# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""The plain `pipeline("text-classification", model=folder)` of a HASTE model against HASTE's own pipeline, at many
labels.

A HASTE model of `--labels` labels (default 300,000, named, so that they live in `label_names.json`) over a tiny BERT
encoder is saved once; then, side by side in one run, the same texts go through

  plain        `pipeline("text-classification", model=folder)`, as users type it
  haste        the same with `pipeline_class=haste_hf.HasteTextClassificationPipeline`
  stock        the same with `pipeline_class=transformers.TextClassificationPipeline` (what the plain call built
               before the package registered its pipeline: a `[B, L]` logit matrix, a dict per label and a sort per
               text), over `--stock-texts` texts only, since it takes minutes

with `top_k=5`, timed in turns (plain, haste, haste, plain, ...; `--repeats` each) so that a change in the machine's
load falls on both, and the table gives the best seconds per text of each (the least disturbed by other processes)
and each call's ratio to `haste`. The plain call must be
within 1.2x of `haste` (and return the same labels); the script exits 1 otherwise.

    python benchmarks/pipeline_call.py                         # 300K labels, 32 texts, 2 stock texts
    python benchmarks/pipeline_call.py --labels 30000 --stock-texts 8 --out results/pipeline_call_cpu.md
"""

import argparse
import os
import platform
import sys
import tempfile
import time


# Run as a script, this folder heads sys.path, and its kernels.py would shadow the `kernels` package that
# transformers looks for: the folder goes before anything imports.
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
from transformers import BertConfig, BertTokenizer, pipeline  # noqa: E402
from transformers.pipelines.text_classification import TextClassificationPipeline  # noqa: E402

import haste_hf  # noqa: E402
from haste_hf import HasteConfig, HasteForExtremeClassification, HasteTextClassificationPipeline  # noqa: E402


WORDS = [f"w{i}" for i in range(200)]
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ALLOWED_RATIO = 1.2


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, default=300_000, help="Label count of the model.")
    parser.add_argument("--texts", type=int, default=32, help="Texts per timed call of `plain` and `haste`.")
    parser.add_argument("--stock-texts", type=int, default=2, help="Texts of the one `stock` call (0: skip it).")
    parser.add_argument("--repeats", type=int, default=6, help="Timed calls of `plain` and of `haste`, in turns.")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads.")
    parser.add_argument("--out", default=None, help="Also write the table (markdown) to this file.")
    return parser.parse_args(argv)


def save_model(folder: str, label_count: int) -> None:
    encoder = BertConfig(
        vocab_size=len(SPECIAL_TOKENS) + len(WORDS),
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    config = HasteConfig(
        encoder=encoder, label_count=label_count, head_label_count=max(1, label_count // 33), group_size=16, fan_in=16
    )
    torch.manual_seed(0)
    model = HasteForExtremeClassification(config).eval()
    model.set_label_names([f"label {i}" for i in range(label_count)])
    model.save_pretrained(folder)
    BertTokenizer(vocab={token: i for i, token in enumerate(SPECIAL_TOKENS + WORDS)}).save_pretrained(folder)


def timed(classifier, texts):
    start = time.perf_counter()
    results = classifier(texts, top_k=5, batch_size=len(texts))
    return time.perf_counter() - start, [[entry["label"] for entry in row] for row in results]


def table(rows: dict, label_count: int, threads: int) -> str:
    """`rows`: call name -> (pipeline class name, seconds per text)."""
    reference = rows["haste"][1]
    lines = [
        f'`pipeline("text-classification")` of a HASTE model, {label_count:,} labels, top_k=5, tiny BERT encoder; '
        f"{platform.processor() or platform.machine()}, {threads} torch threads, torch {torch.__version__}, "
        f"haste_hf {haste_hf.__version__}",
        "",
        "| call | class | s / text | ratio to haste |",
        "|---|---|---|---|",
    ]
    for name, (class_name, seconds) in rows.items():
        lines.append(f"| {name} | {class_name} | {seconds:.4f} | {seconds / reference:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    texts = [" ".join(WORDS[(7 * i + j) % len(WORDS)] for j in range(12)) for i in range(args.texts)]
    with tempfile.TemporaryDirectory() as folder:
        save_model(folder, args.labels)
        calls = {
            "plain": pipeline("text-classification", model=folder),
            "haste": pipeline("text-classification", model=folder, pipeline_class=HasteTextClassificationPipeline),
        }
        for classifier in calls.values():
            timed(classifier, texts[:2])  # warm-up
        times, labels = {name: [] for name in calls}, {}
        for repeat in range(args.repeats):
            for name in list(calls)[:: 1 if repeat % 2 == 0 else -1]:
                seconds, labels[name] = timed(calls[name], texts)
                times[name].append(seconds / len(texts))
        rows = {name: (type(calls[name]).__name__, min(times[name])) for name in calls}
        if args.stock_texts:
            stock = pipeline("text-classification", model=folder, pipeline_class=TextClassificationPipeline)
            seconds, stock_labels = timed(stock, texts[: args.stock_texts])
            rows["stock"] = (type(stock).__name__, seconds / args.stock_texts)
            assert stock_labels == labels["haste"][: args.stock_texts], "stock and haste rank different labels"
    text = table(rows, args.labels, args.threads)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    ratio = rows["plain"][1] / rows["haste"][1]
    if labels["plain"] != labels["haste"]:
        print("the plain call ranks other labels than HASTE's pipeline", file=sys.stderr)
        return 1
    if ratio > ALLOWED_RATIO:
        print(f"the plain call is {ratio:.2f}x HASTE's pipeline (allowed: {ALLOWED_RATIO}x)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
