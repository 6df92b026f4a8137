#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 560 s) of the grouping study (issue 37 item 5): why semantic grouping loses P@1 to random grouping
# on the amazon-670k preset (f5f7750, one H200: 29.45 against 35.20), and the same comparison on real data (`deps`).
#
#   bash benchmarks/grouping_quality_call.sh amazon SCALE [VARIANT ...]
#       `scale_quality.py` on the amazon-670k preset of scale_data.py at SCALE (1: 490K points, 670K labels), one epoch
#       of `haste-hf train` with the defaults, the VARIANTS (names of scale_quality.VARIANTS; default: HASTE semantic,
#       HASTE random, and the two without rewiring) side by side on one GPU, one table (last).
#   bash benchmarks/grouping_quality_call.sh deps LEVER [LEVER ...]
#       `recipe_study.py` on `deps`: `defaults` and `defaults+LEVER` for each LEVER (of recipe_study.LEVERS, e.g.
#       randomgroup, rewire0, rewiregroup), seeds 0-2, at most 6 trainings at once on the GPU; one table (last).
# Inputs (this tree or the checkout around it, see call_setup.sh): .whl, .device-data/minilm-int8, and for `deps`
# .device-data/debian-xmc/deps. HASTE_COMMIT and $OUT as in scale_call.sh. A CPU dry run: `amazon 0.002` (the tiny
# encoder), `deps` with DEPS_DRY=1 (a 300-point cut of `deps`, one seed, 20 steps).
set -uo pipefail
mode=${1:?amazon SCALE [VARIANT ...] | deps LEVER [LEVER ...]}
shift
started=$SECONDS
source benchmarks/call_setup.sh || exit 1
if [ "$mode" = amazon ]; then
    scale=${1:?SCALE: 1 for amazon-670k}
    shift
    [ $# -gt 0 ] || set -- "HASTE semantic" "HASTE random" "HASTE semantic, no rewiring" "HASTE random, no rewiring"
    name=grouping_quality_amazon670k_x${scale}_${card}
    flags=(--test-points 20000)
    [ "$card" = cpu ] && encoder=tiny && flags=(--test-points 200 -- --max-length 32)  # a CPU dry run: tiny encoder
    python3 benchmarks/scale_quality.py --preset amazon-670k --scale "$scale" --encoder "$encoder" --workers 2 \
        --work "${SCALE_WORK:-/tmp/haste-grouping-quality}" --budget-s $((540 - (SECONDS - started))) \
        --json "$out/$name.json" --out "$out/$name.md" --variants "$@" "${flags[@]}" 2>&1 | tee "$out/$name.log"
elif [ "$mode" = deps ]; then
    [ $# -gt 0 ] || { echo "deps: give at least one LEVER (e.g. randomgroup)" >&2; exit 2; }
    data=$(find_asset .device-data/debian-xmc) || exit 1
    seeds=0,1,2 && extra=()
    if [ "${DEPS_DRY:-0}" = 1 ]; then  # a 300-point cut of deps with the tiny encoder: the script's plumbing only
        seeds=0 && mkdir -p /tmp/deps-dry/deps && encoder=$(python3 -c "
import importlib.util  # not benchmarks/ on sys.path: its kernels.py would shadow the kernels package transformers seeks
spec = importlib.util.spec_from_file_location('scale_data', 'benchmarks/scale_data.py')
scale_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(scale_data)
import pathlib; print(scale_data.tiny_encoder(pathlib.Path('/tmp/deps-dry/tiny')))") || exit 1
        for f in trn tst lbl; do zcat "$data/deps/$f.json.gz" | head -300 | gzip > /tmp/deps-dry/deps/$f.json.gz; done
        python3 - <<'PY'  # keep the labels the cut uses: ids below 300 only
import gzip, json
for f in ("trn", "tst"):
    rows = [json.loads(line) for line in gzip.open(f"/tmp/deps-dry/deps/{f}.json.gz", "rt")]
    rows = [dict(r, target_ind=[i for i in r["target_ind"] if i < 300]) for r in rows]
    with gzip.open(f"/tmp/deps-dry/deps/{f}.json.gz", "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows if r["target_ind"])
PY
        data=/tmp/deps-dry && extra=("--extra=--max-steps 20 --max-length 32 --bf16 false")  # variants with flags add --bf16
    fi
    jobs=(deps:defaults:$seeds)
    for lever in "$@"; do jobs+=("deps:defaults+$lever:$seeds"); done
    study_out=/tmp/grouping-quality-deps
    rm -rf "$study_out"
    python3 benchmarks/recipe_study.py --data-root "$data" --datasets deps --encoder "$encoder" --parallel 6 \
        --min-start-s 0 --budget-s 60 --stop-s $((550 - (SECONDS - started))) --jobs "${jobs[@]}" "${extra[@]}" \
        --out "$study_out" > "$out/grouping_quality_deps.log" 2>&1
    python3 benchmarks/recipe_study.py --report --out "$study_out" 2>&1 | tee "$out/grouping_quality_deps.md"
else
    echo "mode must be amazon or deps, got $mode" >&2 && exit 2
fi
echo "wall of the call: $((SECONDS - started)) s"
