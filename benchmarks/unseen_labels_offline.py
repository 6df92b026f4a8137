# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""`benchmarks/unseen_labels.py`'s additions, repeated on one trained held-out model without a GPU: every text the
study embeds (the test split, the model's label names, the held-out labels' texts, their examples, the negatives)
is encoded once and cached, then `model.add_labels` runs in every mode of `unseen_labels.ADDITIONS` on the cached
features (its `embed_texts` looks them up), and the study's metrics are computed on the full ranking. Encoding the
~80K texts of `deps` takes minutes on 2 CPU cores; each mode after it takes seconds. For iterating on the
mechanism of `haste_hf/labels/priors.py` and `additions.py` on a real model; the study itself stays the authority.

    python benchmarks/unseen_labels_offline.py --model .device-data/added/deps-s0-heldout-model \\
        --held-out .device-data/added/deps-s0-held-out.npy --data .device-data/debian-xmc/deps --seed 0 \\
        --cache /tmp/deps-s0-features.pt --cosine results/unseen_labels/runs/deps__cosine__s0.json
"""

import argparse
import importlib.util
import json
import time
from pathlib import Path

import numpy as np
import torch


HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("unseen_labels", HERE / "unseen_labels.py")
unseen_labels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(unseen_labels)

COLUMNS = ("held_P@1", "held_R@5", "overall_P@1", "overall_P@5", "overall_PSP@5")


def load_model(folder: Path):
    """The trained model in float32 (a folder cast to bf16 for transport loads as float32 weights)."""
    from transformers import AutoTokenizer

    from haste_hf import HasteForExtremeClassification

    model = HasteForExtremeClassification.from_pretrained(folder, dtype=torch.float32).float().eval()
    return model, AutoTokenizer.from_pretrained(folder)


def cached_features(model, tokenizer, texts: list[str], cache: Path, batch_size: int) -> tuple[dict, torch.Tensor]:
    """`{text: row}` and the `[n, d]` pooled features of every distinct text of `texts`, encoded once into `cache`
    (texts already there are kept; the rest are encoded, longest first, and saved every few thousand)."""
    from haste_hf.labels.additions import embed_texts

    saved = torch.load(cache) if cache.is_file() else {"texts": [], "features": torch.empty(0, 0)}
    known, parts = list(saved["texts"]), [saved["features"]] if saved["texts"] else []
    seen = set(known)
    missing = sorted({text for text in texts if text not in seen}, key=lambda text: -len(text))
    max_length = min(tokenizer.model_max_length, 512)
    started = time.time()
    for start in range(0, len(missing), 4096):
        chunk = missing[start : start + 4096]
        with torch.inference_mode():
            parts.append(embed_texts(model, tokenizer, chunk, batch_size=batch_size, max_length=max_length))
        known += chunk
        torch.save({"texts": known, "features": torch.cat(parts)}, cache)
        print(f"encoded {start + len(chunk)} of {len(missing)} texts in {time.time() - started:.0f} s", flush=True)
    features = torch.cat(parts)
    return {text: row for row, text in enumerate(known)}, features


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="A held-out model folder of the study.")
    parser.add_argument("--held-out", type=Path, required=True, help="Its held-out label ids (.npy).")
    parser.add_argument("--data", type=Path, required=True, help="The dataset folder (raw-text XMC format).")
    parser.add_argument("--seed", type=int, default=0, help="The study seed of the held-out split.")
    parser.add_argument("--cache", type=Path, required=True, help="Where the encoded features are kept.")
    parser.add_argument("--cosine", type=Path, help="The study's cosine result of this seed, for the ratio.")
    parser.add_argument("--modes", nargs="+", default=list(unseen_labels.ADDITIONS))
    parser.add_argument("--no-calibration", action="store_true", help="Skip the calibration pass (seconds).")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fit-steps", type=int)
    parser.add_argument("--json", type=Path, help="Write the metrics of every mode here.")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    from haste_hf.labels import additions as additions_module

    model, tokenizer = load_model(args.model)
    held_out = np.load(args.held_out)
    evaluation = unseen_labels.Evaluation(args.data, held_out)
    train_rows = unseen_labels.read_rows(args.data / "trn.json.gz")
    texts, examples, negatives = unseen_labels.additions(args.data, evaluation, train_rows, args.seed)
    most = max(unseen_labels.ADDITIONS[name][0] for name in args.modes)
    every = evaluation.texts + list(model.label_names) + texts + negatives + [t for e in examples for t in e[:most]]
    row_of, features = cached_features(model, tokenizer, every, args.cache, args.batch_size)

    def cached_embed_texts(model, tokenizer, texts, **_):
        return features[torch.tensor([row_of[text] for text in texts])]

    additions_module.embed_texts = cached_embed_texts
    test = features[torch.tensor([row_of[text] for text in evaluation.texts])]
    kept = evaluation.kept
    results = {"before": evaluation.of_scores(unseen_labels.model_scores(model, test), kept)}
    to_original = np.concatenate([kept, held_out])
    for name in args.modes:
        trial, seconds = unseen_labels.add_in_mode(
            lambda: load_model(args.model)[0],
            name,
            (texts, examples, negatives, held_out),
            tokenizer,
            args.seed,
            args.fit_steps,
        )
        scores_of = unseen_labels.model_scores(trial, test)
        results[name] = {**evaluation.of_scores(scores_of, to_original), "add_seconds": seconds}
        if not args.no_calibration:
            results[name]["calibration"] = evaluation.calibration(scores_of, to_original)
        print(f"{name}: {seconds:.1f} s, held R@5 {100 * results[name]['held_R@5']:.2f}", flush=True)
    if args.cosine is not None:
        results["cosine"] = json.loads(args.cosine.read_text())["cosine"]
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results))
    return 0


def report(results: dict) -> str:
    """The table of the study for one seed, with the calibration ratio range of each mode."""
    lines = ["| model | " + " | ".join(COLUMNS) + " | new/old true score by frequency | add s |"]
    lines.append("|---" * (len(COLUMNS) + 3) + "|")
    for name, metrics in results.items():
        cells = [f"{100 * metrics[column]:.2f}" if column in metrics else "-" for column in COLUMNS]
        ratios = "-"
        if "calibration" in metrics:
            sums = {key: np.asarray(value) for key, value in metrics["calibration"].items()}
            found = [ratio for _, ratio, _, _ in unseen_labels.frequency_ratios(sums) if ratio is not None]
            ratios = " ".join(f"{ratio:.2f}" for ratio in found)
        seconds = f"{metrics['add_seconds']:.1f}" if "add_seconds" in metrics else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratios} | {seconds} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
