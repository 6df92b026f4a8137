#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 9.5 minutes on one H100) of the 8.6M-label scale run (issue 37): the preset written where it
# runs, `haste-hf group` with semantic grouping (label counts, embeddings, clustering, greedy groups timed apart),
# then train 100 steps with a checkpoint, evaluate, predict, export, reload and add-labels for as long as the
# call's time allows (`scale.py --budget-s`: a stage cut at the end, the rest marked skipped); the table last.
#
# Run from the root of this tree; it needs, beside the tracked files (both folders are git-ignored):
#   .device-data/minilm-int8  python benchmarks/int8_transit.py pack <all-MiniLM-L6-v2 folder> .device-data/minilm-int8
#   .whl/                     datasets (haste_hf.data imports it; the device has none), dill, multiprocess:
#                             python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                               --implementation cp --platform manylinux2014_x86_64 -d .whl \
#                               datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
# HASTE_COMMIT names the commit of this tree in the table (the device's copy has no git of its own).
#
#   bash benchmarks/scale_call.sh [extra scale.py flags]      # $OUT (or /tmp/scale-out) receives the table and JSON
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
started=$SECONDS
out=${OUT:-/tmp/scale-out}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import datasets" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PWD:/tmp/site"
fi
python3 -c "import datasets, torch; print('datasets', datasets.__version__, 'torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
python3 benchmarks/int8_transit.py unpack .device-data/minilm-int8 /tmp/minilm
# The fast label-embedding path on the GPU against the CPU reference (bf16 autocast, pinned non-blocking copies).
python3 -m pytest -q -m gpu -p no:cacheprovider tests/labels/test_grouping_at_scale.py tests/labels/test_grouping.py \
    2>&1 | tail -3 || true
# What is left of 570 s for the stages, less 15 s for the table and the copies.
budget=$((570 - (SECONDS - started) - 15))
python3 benchmarks/scale.py --preset lf-paper2keywords-8.6m --encoder /tmp/minilm --work /tmp/haste-scale \
    --stages data,group,train,evaluate,predict,export,reload,add-labels --max-steps 100 --test-points 5000 \
    --keep-going --budget-s "$budget" --json "$out/scale_8.6m_h100_1gpu.json" --out "$out/scale_8.6m_h100_1gpu.md" "$@" \
    2>&1 | tee "$out/scale_8.6m_h100_1gpu.log" | tr '\r' '\n' | grep -E '^\[scale\]|Error|Traceback|slower than one' || true
cat "$out/scale_8.6m_h100_1gpu.md"
