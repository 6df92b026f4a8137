#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One GPU call (<= 570 s) of the scale run (issue 37 items 1-2, 4; issue 42 item 1): the lf-paper2keywords-8.6m
# preset written where it runs, `haste-hf group` with SEMANTIC grouping (read, label counts, embeddings, clustering,
# greedy groups timed apart), train with a checkpoint, resume, evaluate, predict, export (ONNX), reload and
# add-labels (1,000 labels from text), each a row with wall time, peak GPU and peak host RSS; the table last.
# Stages past the call's time are marked skipped (`scale.py --budget-s`), never silently dropped.
#
#   bash benchmarks/scale_call.sh SCALE GPUS [extra scale.py flags]
#     SCALE  the preset's size (1: 8.6M labels; 0.0005: 4,312 labels, a CPU dry run of this same script)
#     GPUS   processes of train and resume (1; 2 or 4: torchrun, the output layer sharded by labels)
#
# Run from the root of this tree (on the device: `cd .wt/<branch>` after the wheels' install). It reads, from this
# tree or the checkout around it (../../, where a worktree sits in .wt/), the git-ignored folders
#   .device-data/minilm-int8  python benchmarks/int8_transit.py pack <all-MiniLM-L6-v2 folder> .device-data/minilm-int8
#   .whl/                     datasets, dill, multiprocess (haste_hf.data imports datasets; the device has none)
# (`call_setup.sh`). HASTE_COMMIT names the commit of this tree in the table (the device's copy has no git): pass it.
# $OUT (or /tmp/scale-out) receives scale_<labels>_<card>_<GPUS>gpu.{md,json,log}. With GPUS > 1 the call first
# runs data, group and train on one GPU of the same machine (scale_<labels>_<card>_1gpu_base.*: item 4's baseline,
# same card and load), then train and resume on GPUS processes and the one-process stages on that model; its table
# compares the busiest rank's peak and the texts/s against the baseline's.
set -euo pipefail
scale=${1:?SCALE: 1 for 8.6M labels, e.g. 0.0005 for a CPU dry run}
gpus=${2:?GPUS: processes of train and resume}
shift 2
started=$SECONDS
work=${SCALE_WORK:-/tmp/haste-scale}
source benchmarks/call_setup.sh
tag=$(python3 -c "
labels = round(8_623_847 * float('$scale'))
print(f'{labels / 1e6:.1f}m' if labels >= 1e6 else f'{labels / 1e3:.0f}k' if labels >= 1e3 else str(labels))")_${card}_${gpus}gpu
run_scale() {  # scale.py with this call's settings; $1: the results' name, then scale.py's own flags
    local name=$1
    shift
    python3 benchmarks/scale.py --preset lf-paper2keywords-8.6m --scale "$scale" --encoder "$encoder" --work "$work" \
        --max-steps 60 --resume-steps 20 --test-points 5000 --keep-going \
        --budget-s $((555 - (SECONDS - started))) --json "$out/$name.json" --out "$out/$name.md" "$@" "${extra[@]}" \
        2>&1 | tee "$out/$name.log" | tr '\r' '\n' \
        | grep --line-buffered -E '^\[scale\]|Error|Traceback|slower than one|Label embeddings: +100%|texts embedded|Grouped |Counted the labels' || true
}
extra=("$@")
if [ "$gpus" -eq 1 ]; then
    run_scale "scale_$tag" --gpus 1 --stages data,group,train,resume,evaluate,predict,export,reload,add-labels
else
    # The one-GPU baseline of item 4 on this machine (its card, its load), then the same stages on $gpus processes;
    # the stages after train run one process each, on a model trained on $gpus.
    base="scale_${tag%_*gpu}_1gpu_base"
    CUDA_VISIBLE_DEVICES=0 run_scale "$base" --gpus 1 --stages data,group,train
    cp "$out/$base.json" "$out/scale_$tag.json"  # the data and group rows carry over
    run_scale "scale_$tag" --gpus "$gpus" --stages train,resume,evaluate,predict,export,reload,add-labels \
        --compare "$out/$base.json"
    cat "$out/$base.md"
fi
echo "wall of the call: $((SECONDS - started)) s"
cat "$out/scale_$tag.md"
