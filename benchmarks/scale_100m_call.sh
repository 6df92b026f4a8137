#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 570 s) of 10^8 labels through `haste-hf` (issue 37 item 3): the `synthetic-100m` preset of
# scale_data.py (4M training points of 27.5 labels, every label seen at least once) written where it runs,
# `haste-hf group --grouping random` (RANDOM grouping: embedding 4M texts does not fit the call; the rows say so),
# `haste-hf train` for 30 steps with a checkpoint at the last, the final save and the test evaluation, then
# `haste-hf evaluate` and `haste-hf predict` (top 5 to a file) of the saved model. Fan-in 64 (the default 128 holds
# 12.8G tail weights: 51 GB of bf16 weights and momentum, past the 40 GiB); every other flag the CLI's.
# Target: peak GPU <= 40 GiB (it must fit an H100). Each stage's wall time, peak GPU and peak host RSS; the table last.
#
#   bash benchmarks/scale_100m_call.sh SCALE [extra scale.py flags]
#     SCALE  the preset's size (1: 10^8 labels; 0.0005: 50,000 labels, a CPU dry run of this same script)
# Inputs, HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`).
set -euo pipefail
scale=${1:?SCALE: 1 for 10^8 labels, e.g. 0.0005 for a CPU dry run}
shift
started=$SECONDS
source benchmarks/call_setup.sh
name=scale_100m_${card}_1gpu
[ "$scale" = 1 ] || name=scale_100m_x${scale}_${card}_1gpu
python3 benchmarks/scale.py --preset synthetic-100m --scale "$scale" --encoder "$encoder" \
    --work "${SCALE_WORK:-/tmp/haste-scale-100m}" --stages data,group,train,evaluate,predict \
    --group-flag "--grouping random" --train-flag "--fan-in 64" --max-steps 30 --test-points 1000 --keep-going \
    --budget-s $((555 - (SECONDS - started))) --json "$out/$name.json" --out "$out/$name.md" "$@" \
    2>&1 | tee "$out/$name.log" | tr '\r' '\n' \
    | grep --line-buffered -E '^\[scale\]|Error|Traceback|Counted the labels|memory plan|Memory plan' || true
echo "wall of the call: $((SECONDS - started)) s"
cat "$out/$name.md"
