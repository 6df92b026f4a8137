# Copyright 2026 The haste_hf Authors. Apache-2.0.
"""How long the parts of `add_labels`' text map and calibration take on an output layer of `--labels` labels
(random weights, default 10^7; the study measures 43K end to end): the trained labels' masses on the reference
texts, the ridge map on `MAX_MAP_LABELS` label texts (`--branch tail`: with the distilled scale; `head`, the
default placement: the head map from every map label), the
expected masses of `--new` labels from their nearest trained labels' texts, their scores on the reference and
their offsets; and the memory the new labels take. The label texts' embedding is not timed here:
`MAX_MAP_LABELS` short texts through the encoder, as many as the study embeds at 43K labels for every 2.3.

    python benchmarks/label_addition_scale.py --labels 10000000 --new 4306
    python benchmarks/label_addition_scale.py --labels 1000000 --new 100000 --branch head
"""

import argparse
import sys
import time

import torch

from haste_hf.labels import priors
from haste_hf.labels.additions import NewLabelWeights, place_new_labels
from haste_hf.labels.rank_caps import rank_thresholds
from haste_hf.modeling.output_layer import HasteOutputLayer


def timed(device, function):
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    result = function()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - started


class Rows(list):
    """The table's rows, each printed as it is appended."""

    def append(self, row) -> None:
        super().append(row)
        print(f"| {row[0]} | {row[1]} |", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--labels", type=int, default=10_000_000)
    parser.add_argument("--new", type=int, default=4306)
    parser.add_argument("--features", type=int, default=384)
    parser.add_argument("--branch", choices=("head", "tail"), default="head")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    layer = HasteOutputLayer(args.features, args.labels, round(0.03 * args.labels), 16, 128).to(device).eval()
    reference = torch.randn(priors.REFERENCE_TEXTS, args.features, device=device)
    map_count = min(args.labels, priors.MAX_MAP_LABELS)
    texts = torch.randn(map_count, args.features, device=device)
    label_ids = priors.map_labels(args.labels, 0).to(device)
    new_x = torch.randn(args.new, args.features, device=device)
    # Each row is printed as it is measured: a call cut by its time limit keeps the parts it measured.
    print("| part | value |\n|---|---|", flush=True)
    rows = Rows()
    rows.append(("labels", args.labels))
    rows.append(("new labels", args.new))
    (_, masses), seconds = timed(device, lambda: priors.label_masses(layer, reference))
    rows.append(("trained labels' masses on the reference (s)", f"{seconds:.1f}"))
    head = args.branch == "head"
    if not head:
        start, seconds = timed(
            device,
            lambda: priors.mapped_weights(
                layer, "tail", new_x, texts, label_ids, layer.branch_inputs(reference)[1], priors.BLENDS
            ),
        )
        rows.append(("ridge map of the tail weights + distilled scale (s)", f"{seconds:.1f}"))
    else:
        start, seconds = timed(
            device, lambda: priors.mapped_weights(layer, "head", new_x, texts, label_ids, blends=(priors.HEAD_BLEND,))
        )
        rows.append(("ridge map of the head rows from every map label (s)", f"{seconds:.1f}"))
    _, seconds = timed(device, lambda: priors.nearest_log_masses(texts, masses[label_ids].log(), new_x))
    rows.append(("expected masses from the nearest trained labels' texts (s)", f"{seconds:.1f}"))
    (_, seconds) = timed(device, lambda: rank_thresholds(layer, reference))
    rows.append(("trained labels' top-1 / top-5 on the reference, for the rank caps (s)", f"{seconds:.1f}"))
    # The whole calibration of `add_labels` on these rows: levels, rank caps, a chunk of new labels at a time.
    weights = NewLabelWeights(layer, place_new_labels(layer, args.new, None if head else start.weights, 0), args.new)
    weights.initialize(layer, start)
    embedded = torch.cat([new_x, reference, texts])
    features = {"head": embedded, "tail": embedded}
    references = torch.arange(args.new, args.new + reference.shape[0], device=device)
    fit_rows = torch.arange(args.new + reference.shape[0], embedded.shape[0], device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    _, seconds = timed(
        device,
        lambda: priors.calibrate_new_labels(layer, weights, embedded, features, (references, fit_rows, label_ids)),
    )
    rows.append(("calibrate_new_labels: levels and rank caps of the new labels (s)", f"{seconds:.1f}"))
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated() - held) / 1e9
        rows.append(("  its peak memory above what was held (GB)", f"{peak:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
