#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (about 8 minutes on one H100): grouping quality with the fast label-embedding path (issue 37 item 1),
# `deps` through `haste-hf train` with the CLI defaults (semantic grouping inside `train`), seeds 0-2, the fast path
# (`token_batches`: chunks tokenised in the Rust backend, sorted by length, padded on the GPU) beside the previous
# default, side by side on the same GPU (3 runs each, `recipe_study.py`), so both see the same card and load.
#
# The previous default needs no git and nothing carried: before 1737671 the label embeddings ran the tokenizer's
# own call on batches of --eval-batch-size texts in order, the loop that stays as `embeddings._sums_of_batches` for
# tokenizers without a Rust backend. The baseline is a copy of this tree's haste_hf (1.7 MB, in /tmp) whose
# `token_batches.fast_backend` answers None, so every label embedding takes that loop; nothing else differs.
#
# Run from the root of this tree (on the device: `cd .wt/<branch>`); it reads, from this tree or the checkout
# around it (../../), the git-ignored folders
#   .device-data/minilm-int8          python benchmarks/int8_transit.py pack <all-MiniLM-L6-v2> .device-data/minilm-int8
#   .device-data/debian-xmc/deps      cp -r /work/shared/data/debian-xmc/deps .device-data/debian-xmc/
#   .whl/                             datasets, dill, multiprocess (see scale_call.sh)
# HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`). After the table, with the call's time left, the GPU
# tests of the label embeddings and grouping (the fast path on CUDA against the CPU reference).
#
#   bash benchmarks/grouping_ab_call.sh
# Pass: the fast path's P@1/3/5 and PSP@1/3/5 within the baseline's 3-seed spread (mean +- 2 standard deviations).
set -uo pipefail
started=$SECONDS
source benchmarks/call_setup.sh || exit 1
study_out=/tmp/grouping-ab  # six runs' files: $OUT gets the two studies' logs and the table (grouping_ab.md)
rm -rf "$study_out" && mkdir -p "$study_out"
baseline=/tmp/ab-baseline
rm -rf "$baseline" && mkdir -p "$baseline" && cp -r haste_hf "$baseline/"
cat >> "$baseline/haste_hf/labels/token_batches.py" <<'EOF'


def fast_backend(tokenizer, max_length):  # the A/B's baseline: every label embedding by the tokenizer's own call
    return None
EOF
check_path() {  # $1: the tree whose haste_hf runs; $2: whether its fast path is on (True / False)
    (cd /tmp && PYTHONPATH="$1:$PYTHONPATH" python3 -c "
import haste_hf, haste_hf.labels.embeddings as e
from transformers import AutoTokenizer
fast = e.fast_backend(AutoTokenizer.from_pretrained('$encoder'), 128) is not None
assert haste_hf.__file__.startswith('$1') and fast == $2, (haste_hf.__file__, fast)
print('$1: fast label-embedding path', fast)")
}
check_path "$baseline" False && check_path "$PWD" True || exit 1
study=(--data-root "$(find_asset .device-data/debian-xmc)" --datasets deps --encoder "$encoder"
    --parallel 3 --min-start-s 0 --budget-s 60 --stop-s 540 --jobs deps:defaults:0,1,2)
(PYTHONPATH="$baseline:$PYTHONPATH" python3 benchmarks/recipe_study.py "${study[@]}" --out "$study_out/baseline" \
    > "$out/grouping_ab_baseline.log" 2>&1) &
(python3 benchmarks/recipe_study.py "${study[@]}" --out "$study_out/fast" \
    > "$out/grouping_ab_fast.log" 2>&1) &
wait
for log in "$study_out"/{baseline,fast}/runs/*.log; do  # each run's label-embedding speed (its progress bar)
    echo "$log: $(tr '\r' '\n' < "$log" | grep -E 'Label embeddings: +100%' | tail -1)"
done
python3 - "$study_out" <<'EOF' | tee "$out/grouping_ab.md"
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
keys = ("P@1", "P@3", "P@5", "PSP@1", "PSP@3", "PSP@5")
runs = {}
for side in ("baseline", "fast"):
    runs[side] = [json.loads(p.read_text()) for p in sorted((out / side / "runs").glob("deps__defaults__s*.json"))]
    runs[side] = [r for r in runs[side] if r["status"] == 0]
print("| embedding path | seeds | " + " | ".join(keys) + " | minutes |")
print("|---|---|" + "---|" * (len(keys) + 1))
summary = {}
for side, results in runs.items():
    cells = []
    for key in keys:
        values = [100 * r["metrics"][key] for r in results]
        mean = statistics.mean(values) if values else float("nan")
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[side, key] = (mean, sd)
        cells.append(f"{mean:.2f} ± {sd:.2f}")
    minutes = statistics.mean(r["seconds"] / 60 for r in results) if results else float("nan")
    name = "previous (tokenizer call, batches in order)" if side == "baseline" else "fast (token_batches)"
    print(f"| {name} | {len(results)} | " + " | ".join(cells) + f" | {minutes:.1f} |")
if len(runs["baseline"]) == len(runs["fast"]) == 3:
    outside = [k for k in keys if abs(summary["fast", k][0] - summary["baseline", k][0]) > 2 * summary["baseline", k][1]]
    print("PASS: within the baseline's mean +- 2 sd" if not outside else f"OUTSIDE the baseline's spread: {outside}")
else:
    print(f"incomplete: {len(runs['baseline'])} baseline and {len(runs['fast'])} fast runs finished")
EOF
echo "wall of the trainings: $((SECONDS - started)) s"
left=$((585 - (SECONDS - started)))
if [ "$left" -gt 20 ]; then
    timeout "$left" python3 -m pytest -q -m gpu -p no:cacheprovider tests/labels/test_grouping_at_scale.py \
        tests/labels/test_grouping.py tests/labels/test_token_batches.py 2>&1 | tail -3
fi
