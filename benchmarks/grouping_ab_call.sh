#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (about 8 minutes on one H100): grouping quality with the fast label-embedding path (issue 37),
# `deps` through `haste-hf train` with the CLI defaults (semantic grouping inside `train`), seeds 0-2, the code of
# the checkout that runs it (the baseline: main) beside the code of the tree in $1 (this branch), side by side on
# the same GPU (3 runs each, `recipe_study.py`), so both see the same card and the same load.
#
# Run from the root of the main checkout, with the branch's tree carried (e.g. .wt/scale); that tree holds, in
# git-ignored folders:
#   .device-data/minilm-int8          python benchmarks/int8_transit.py pack <all-MiniLM-L6-v2> .device-data/minilm-int8
#   .device-data/debian-xmc/deps      cp -r /work/shared/data/debian-xmc/deps .device-data/debian-xmc/
#   .whl/                             datasets, dill, multiprocess (see scale_call.sh)
#
#   bash .wt/scale/benchmarks/grouping_ab_call.sh .wt/scale
# Pass: the branch's P@1/3/5 and PSP@1/3/5 within the baseline's 3-seed spread (mean +- 2 standard deviations).
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$PWD
tree=$(cd "${1:?the branch tree, e.g. .wt/scale}" && pwd)
out=${OUT:-/tmp/grouping-ab}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$tree"/.whl/*.whl
study=(--data-root "$tree/.device-data/debian-xmc" --datasets deps --encoder "$tree/.device-data/minilm-int8"
    --parallel 3 --min-start-s 0 --budget-s 60 --stop-s 540 --jobs deps:defaults:0,1,2)
(cd "$root" && PYTHONPATH="$root:/tmp/site" python3 benchmarks/recipe_study.py "${study[@]}" --out "$out/main" \
    > "$out/main.log" 2>&1) &
(cd "$tree" && PYTHONPATH="$tree:/tmp/site" python3 benchmarks/recipe_study.py "${study[@]}" --out "$out/branch" \
    > "$out/branch.log" 2>&1) &
wait
for side in main branch; do
    echo "## $side"
    (cd "$tree" && PYTHONPATH="$tree:/tmp/site" python3 benchmarks/recipe_study.py --report --out "$out/$side")
done
