"""Cut the small demo dataset shipped in `haste_hf/demo_data/debian_tags_mini` from debian-xmc `tags`.

The cut is reproducible: a seeded sample of training and test packages, labels restricted to those seen in
the sampled training set and renumbered by their frequency there (most frequent first, ties keep the source
order), test packages left without any label dropped. Texts are copied unchanged (title and full content);
truncation is left to the tokenizer. The gzip streams carry no timestamp, so reruns give identical bytes.

    python examples/make_demo_dataset.py --source /work/shared/data/debian-xmc/tags
"""

import argparse
import gzip
import io
import json
from pathlib import Path

import numpy as np


def read_json_lines(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def write_json_lines(path: Path, records: list[dict]) -> None:
    payload = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records).encode("utf-8")
    buffer = io.BytesIO()
    # mtime=0 and no file name in the header make the output byte-identical across runs.
    with gzip.GzipFile(filename="", fileobj=buffer, mode="wb", compresslevel=9, mtime=0) as handle:
        handle.write(payload)
    path.write_bytes(buffer.getvalue())


def cut(source: Path, output: Path, num_train: int, num_test: int, seed: int) -> dict:
    train = read_json_lines(source / "trn.json.gz")
    test = read_json_lines(source / "tst.json.gz")
    labels = read_json_lines(source / "lbl.json.gz")
    if num_train > len(train) or num_test > len(test):
        raise ValueError(f"asked for {num_train}/{num_test} points but the source has {len(train)}/{len(test)}")

    rng = np.random.default_rng(seed)
    train = [train[i] for i in np.sort(rng.choice(len(train), size=num_train, replace=False))]
    test = [test[i] for i in np.sort(rng.choice(len(test), size=num_test, replace=False))]

    counts = np.bincount([label for record in train for label in record["target_ind"]], minlength=len(labels))
    seen = np.flatnonzero(counts)
    # Stable sort on -count: most frequent first, ties in the source (global frequency) order.
    kept = seen[np.argsort(-counts[seen], kind="stable")]
    new_id = {int(old): new for new, old in enumerate(kept)}

    def remap(record: dict) -> dict:
        targets = [new_id[label] for label in record["target_ind"] if label in new_id]
        return {**record, "target_ind": targets}

    train = [remap(record) for record in train]
    test = [record for record in map(remap, test) if record["target_ind"]]
    output.mkdir(parents=True, exist_ok=True)
    write_json_lines(output / "trn.json.gz", train)
    write_json_lines(output / "tst.json.gz", test)
    write_json_lines(output / "lbl.json.gz", [labels[old] for old in kept])

    new_counts = counts[kept]
    return {
        "train": len(train),
        "test": len(test),
        "labels": len(kept),
        "labels_seen_once": int((new_counts == 1).sum()),
        "max_label_count": int(new_counts.max()),
        "mean_labels_per_train_point": float(np.mean([len(r["target_ind"]) for r in train])),
        "bytes": sum((output / name).stat().st_size for name in ("trn.json.gz", "tst.json.gz", "lbl.json.gz")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=Path("/work/shared/data/debian-xmc/tags"))
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).resolve().parents[1] / "haste_hf/demo_data/debian_tags_mini"
    )
    parser.add_argument("--num-train", type=int, default=3000)
    parser.add_argument("--num-test", type=int, default=800)
    parser.add_argument("--seed", type=int, default=20261123)
    args = parser.parse_args()
    stats = cut(args.source, args.output, args.num_train, args.num_test, args.seed)
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
