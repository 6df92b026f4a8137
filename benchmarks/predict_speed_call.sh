#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 560 s) of issue 37 item 2's evaluate and predict speed at 8.6M labels (target: >= 5,000 texts/s on
# one GPU): `scale_call.sh 1 1` with data, group (semantic), train (20 steps: the model is all that is needed),
# evaluate and predict of 50,000 test texts, each row's "scoring" texts/s the test texts over its top-k phase; then
# `predict_path.py` at 8.6M labels (20,000 titles), the paths of `predict_top_k` side by side in one process: the
# per-batch tokenizer (the path before) against the token chunks, each in float32 and under bf16 autocast.
#
#   bash benchmarks/predict_speed_call.sh [SCALE]   (SCALE 1: 8.6M labels; 0.0005: a CPU dry run of this script)
# Inputs, HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`).
set -euo pipefail
scale=${1:-1}
started=$SECONDS
source benchmarks/call_setup.sh
full=$([ "$scale" = 1 ] && echo 1 || echo 0)
bash benchmarks/scale_call.sh "$scale" 1 --stages data,group,train,evaluate,predict --max-steps 20 --budget-s 400 \
    --test-points $((full ? 50000 : 500)) || echo "scale_call.sh: exit $?"
labels=$(python3 -c "print(round(8_623_847 * float('$scale')))")
TQDM_DISABLE=1 timeout $((550 - (SECONDS - started))) python3 benchmarks/predict_path.py --encoder "$encoder" \
    --labels "$labels" --texts $((full ? 20000 : 300)) --out "$out/predict_path_${card}.md" || echo "predict_path.py: stopped"
echo "wall of the call: $((SECONDS - started)) s"
