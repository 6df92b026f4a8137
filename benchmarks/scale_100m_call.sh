#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 570 s) of 10^8 labels through `haste-hf` (issue 37 item 3): the `synthetic-100m` preset of
# scale_data.py (4M training points of 27.5 labels, every label seen at least once: about the fewest points that see
# 10^8 labels) written where it runs, then `haste-hf train --grouping random` for 30 steps with a checkpoint at the
# last, the final save and the test evaluation, then `haste-hf evaluate` and `haste-hf predict` (top 5 to a file) of
# the saved model. What the rows say:
# - RANDOM grouping, done by train itself (`--group-in-train`: no `haste-hf group` stage, whose read of the 4.5 GB of
#   gzip and label counts took 180 s of the call, only for train to read it all again): embedding 4M texts does not
#   fit the call; train's phases (read, label counts, grouping) are the group rows.
# - `--no-init-from-label-texts`: the default starts each label's rows from the encoder's embedding of its text, 10^8
#   texts (2,000 s at 50K/s): it does not fit the call; the rows start at random.
# - Fan-in 64 (the default 128 holds 12.8G tail weights: 51 GB of bf16 weights and momentum, past the 40 GiB).
# Every other flag the CLI's. Target: peak GPU <= 40 GiB (it must fit an H100). Each stage's wall time, peak GPU and
# peak host RSS; the table last.
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
    --work "${SCALE_WORK:-/tmp/haste-scale-100m}" --stages data,train,evaluate,predict --group-in-train \
    --group-flag "--grouping random" --train-flag "--fan-in 64 --no-init-from-label-texts" --max-steps 30 \
    --test-points 1000 --keep-going \
    --budget-s $((555 - (SECONDS - started))) --json "$out/$name.json" --out "$out/$name.md" "$@" \
    2>&1 | tee "$out/$name.log" | tr '\r' '\n' \
    | grep --line-buffered -E '^\[scale\]|Error|Traceback|Counted the labels|memory plan|Memory plan' || true
echo "wall of the call: $((SECONDS - started)) s"
cat "$out/$name.md"
