#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One call on a machine of several GPUs (<= 570 s) of up to 10^9 labels through `haste-hf` (issue 42 item 2): the
# `synthetic-1b` preset of scale_data.py (10^9 labels; 10^8 of them in 4M training points of 27.5 labels, the other
# 9 x 10^8 with a label text and no point, so the data needs no more positives than the 10^8 preset) at SCALE,
# `haste-hf group --grouping random`, `haste-hf train` on GPUS processes (torchrun, the output layer sharded by labels,
# each rank building only its rows; the memory plan's options) for the steps the call allows with a checkpoint at
# the last, the test evaluation, then `haste-hf predict` on the same GPUS processes (each rank loads and scores its
# share of the labels; top 5 to a file). Fan-in 64 as the 10^8 call, without output momentum and without label-text
# initialisation: `python benchmarks/memory_plan_at.py --labels 1e9 --gpus 4 --fan-in 64` plans 77.2 GiB a rank with
# momentum (34.3 GiB of bf16 weights and as much momentum), over the 67.3 GiB (85%) of an H100, and 44.8 GiB with
# `--output_momentum 0`; label-text init (the recipe's default where the data has label texts, as this preset has)
# is off: each rank would embed its own labels' texts (10^9 in all) and read every label's text, where without it a
# rank reads only the quarter of lbl.json.gz whose names it saves (`label_text_share`), its layout without the int64
# training counts, and holds the propensities as int32 counts; `predict` reads no label text. Flags without a value
# go as `--train-flag=--flag` (argparse takes `--train-flag --flag` for two options and stops). Each stage's wall
# time, peak GPU and peak host RSS; the table last. Checkpoints and the final save are written by every rank, its rows of the output layer in a
# file of its own (nothing gathered), with its label ids and its range of label names. Weights-only checkpoints
# (`--save-only-model`): at 10^9 labels the bf16 output layer is 147 GB (163 GB with the int32 supports) and its
# momentum as much again, where a 4-GPU machine has 235 GB of disk. The final save links the last checkpoint's
# files (hard links, checked byte for byte) instead of writing them again: the two take one copy, about 205 GB at
# SCALE 1 (output layer 163, label ids 8, label names 34); the data and the layout file take the rest, so at SCALE 1
# keep SCALE_WORK on the largest disk, or add `--train-flag "--save-strategy no"` (the final save then the only copy).
#
#   bash benchmarks/scale_1b_call.sh SCALE [GPUS] [extra scale.py flags]
#     SCALE  the preset's size (1: 10^9 labels; 0.5: 5 x 10^8; 0.00002: 20,000 labels, a CPU dry run)
#     GPUS   processes of train (default: every visible GPU)
# Inputs, HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`).
set -euo pipefail
scale=${1:?SCALE: 1 for 10^9 labels, e.g. 0.00002 for a CPU dry run}
shift
gpus=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
if [ $# -gt 0 ] && [[ $1 != -* ]]; then gpus=$1 && shift; fi
started=$SECONDS
source benchmarks/call_setup.sh
name=scale_1b_x${scale}_${card}_${gpus}gpu
python3 benchmarks/scale.py --preset synthetic-1b --scale "$scale" --encoder "$encoder" --gpus "$gpus" \
    --work "${SCALE_WORK:-/tmp/haste-scale-1b}" --stages data,group,train,predict \
    --group-flag "--grouping random" --train-flag "--fan-in 64" --train-flag "--output_momentum 0" \
    --train-flag=--no_init_from_label_texts --train-flag "--save-only-model true" --max-steps "${MAX_STEPS:-20}" --test-points 1000 \
    --keep-going --budget-s $((555 - (SECONDS - started))) --json "$out/$name.json" --out "$out/$name.md" "$@" \
    2>&1 | tee "$out/$name.log" | tr '\r' '\n' \
    | grep --line-buffered -E '^\[scale\]|Error|Traceback|Counted the labels|memory plan|Memory plan' || true
echo "wall of the call: $((SECONDS - started)) s"
cat "$out/$name.md"
