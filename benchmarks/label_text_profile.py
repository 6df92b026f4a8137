# Copyright 2026 The haste_hf Authors. Licensed under the Apache License, Version 2.0.
"""The parts of the label-text initialisation (`haste_hf.labels.text_init`) timed one after another on a label file:
where its time goes at millions of labels (issue 37: 174 s for 8.6M labels of three words on an H200).

    python benchmarks/scale_data.py --preset lf-paper2keywords-8.6m --scale 0.05 --out /tmp/lt
    python benchmarks/label_text_profile.py /tmp/lt/lbl.json.gz --workers 2     # host parts, a 1-layer encoder
    # on a GPU (after `source benchmarks/call_setup.sh`): workers as the package decides, then none (threads only)
    python3 benchmarks/label_text_profile.py /tmp/p2k/lbl.json.gz --encoder /tmp/minilm --device cuda
    python3 benchmarks/label_text_profile.py /tmp/p2k/lbl.json.gz --encoder /tmp/minilm --device cuda --workers 0

Rows: reading the file; the blank-text check; tokenising the first `--serial-limit` texts here in one thread
(`tokenize_chunk` chunk by chunk: the Rust tokenizer, the per-text Python that makes flat arrays of its encodings,
the sort and the batches); every text tokenised in worker processes (`tokenizer_processes`, where this version has
them); the whole streamed pass of `label_text_embeddings` (tokenising ahead, padding on the device, the encoder, the
blocks put back in order) with the encoder named (`tiny`: one layer of width 32 over the tokenizer's vocabulary, so
that the row shows the host's work). Each row: wall seconds and the CPU seconds of this process (all its threads,
not the workers'): what this process spends beside the thread that runs the encoder, which a loaded machine's wall
times hide.
"""

import argparse
import os
import sys
import time
from multiprocessing.pool import ThreadPool

import torch


# Run as a script, this folder heads sys.path, and its kernels.py would shadow the `kernels` package that
# transformers probes for (as in scale.py).
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [path for path in sys.path if os.path.abspath(path or ".") != HERE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("labels", help="an lbl.json[.gz] file (`scale_data.py`)")
    parser.add_argument("--encoder", default="tiny", help="`tiny` (host work only) or a model name or path (minilm)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--limit", type=int, default=None, help="the first N label texts only")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--serial-limit", type=int, default=500_000, help="texts of the one-thread row (0: none)")
    parser.add_argument(
        "--workers", type=int, default=None, help="tokenizer worker processes (default: as the package decides)"
    )
    args = parser.parse_args()

    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from haste_hf.labels.embeddings import _with_text, label_text_embeddings
    from haste_hf.labels.token_batches import CHUNK_TEXTS, fast_backend, tokenize_chunk
    from haste_hf.modeling.model_sources import resolve_encoder
    from haste_hf.xmc_files import read_json_label_texts

    rows = []

    def timed(name, function, count=None):
        started, cpu = time.perf_counter(), time.process_time()
        result = function()
        rows.append((name, count, time.perf_counter() - started, time.process_time() - cpu))
        return result

    texts = timed("read label texts", lambda: read_json_label_texts(args.labels))
    rows[-1] = ("read label texts", len(texts), *rows[-1][2:])
    texts = list(texts[: args.limit] if args.limit else texts)
    timed("blank check", lambda: _with_text(texts, "-"))
    serial = texts[: args.serial_limit]
    source = resolve_encoder("minilm" if args.encoder == "tiny" else args.encoder)
    tokenizer = AutoTokenizer.from_pretrained(source)
    backend = fast_backend(tokenizer, None)
    if serial:
        timed(
            "tokenise, one thread",
            lambda: [
                tokenize_chunk(backend, serial[s : s + CHUNK_TEXTS], 65536) for s in range(0, len(serial), CHUNK_TEXTS)
            ],
            len(serial),
        )
    try:
        from haste_hf.labels import tokenizer_processes
    except ImportError:  # a version without worker processes
        tokenizer_processes = None
    if tokenizer_processes is not None and args.workers is not None:
        tokenizer_processes.process_count = lambda: args.workers  # also for the streamed pass below
    if tokenizer_processes is not None and tokenizer_processes.process_count():

        def in_workers():
            count = tokenizer_processes.process_count()
            with (
                tokenizer_processes.TokenizerProcesses(backend, count, with_types=False) as workers,
                ThreadPool(count) as pool,
            ):
                return pool.map(workers.encode, [texts[s : s + CHUNK_TEXTS] for s in range(0, len(texts), CHUNK_TEXTS)])

        timed(f"tokenise, {tokenizer_processes.process_count()} worker processes", in_workers)
    if args.encoder == "tiny":
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
        )
        encoder = BertModel(config, add_pooling_layer=False)
    else:
        encoder = AutoModel.from_pretrained(source)
    options = dict(tokenizer=tokenizer, batch_size=args.batch_size, device=args.device, show_progress=False)

    def stream():
        count = sum(block.shape[0] for block in label_text_embeddings(encoder, texts, **options))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return count

    timed(f"label_text_embeddings ({args.encoder})", stream)
    total = len(texts)
    print(f"{total:,} label texts, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, device {args.device}")
    print("| part | texts | wall s | texts/s | CPU s of this process |\n|---|---:|---:|---:|---:|")
    for name, count, seconds, cpu in rows:
        count = total if count is None else count
        print(f"| {name} | {count:,} | {seconds:.2f} | {count / seconds:,.0f} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
