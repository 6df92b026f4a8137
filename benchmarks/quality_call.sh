#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 570 s) of quality at scale (issue 37 item 5, `scale_quality.py`): the amazon-670k preset of
# scale_data.py (490K training points, 670K labels; 20,000 test points), one epoch of `haste-hf train` with the
# defaults for HASTE semantic, HASTE random and Dense (head fraction 1) side by side on one GPU, against the most
# frequent and random labels: P@1/3/5, PSP@1/3/5, wall time and peak GPU of each run in one table (last).
#
#   bash benchmarks/quality_call.sh SCALE [scale_quality.py flags] [-- extra `haste-hf train` flags]
#     SCALE  the preset's size (1: amazon-670k; 0.002: 1,340 labels, a CPU dry run with the tiny encoder)
# Inputs, HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`).
set -euo pipefail
scale=${1:?SCALE: 1 for amazon-670k, e.g. 0.002 for a CPU dry run}
shift
started=$SECONDS
source benchmarks/call_setup.sh
name=quality_amazon670k_${card}
[ "$scale" = 1 ] || name=quality_amazon670k_x${scale}_${card}
[ "$card" = cpu ] && encoder=tiny  # a CPU dry run: the small syllable encoder
python3 benchmarks/scale_quality.py --preset amazon-670k --scale "$scale" --encoder "$encoder" \
    --work "${SCALE_WORK:-/tmp/haste-quality}" --budget-s $((550 - (SECONDS - started))) \
    --json "$out/$name.json" --out "$out/$name.md" "$@" 2>&1 | tee "$out/$name.log" || true
echo "wall of the call: $((SECONDS - started)) s"
