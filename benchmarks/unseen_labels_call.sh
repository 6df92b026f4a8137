#!/usr/bin/env bash
# Issue 36, branch calib: the unseen-labels study on deps and tags (3 seeds each) and the 10^7-label timing of the
# calibration, in ONE device call on a 2-GPU machine, <= 540 s wall. Run from the repository root of the device copy:
#
#   run(kind="nvidia-h100-x2", timeout_s=600,
#       command="HASTE_COMMIT=$(calib's short commit) bash .wt/calib/benchmarks/unseen_labels_call.sh",
#       carry=[".wt/calib", ".device-data/debian-xmc", ".device-data/minilm-int8", ".whl"])
#
#   GPU0, cores 0-15:  unseen_labels.py --datasets deps --seeds 0 1 2, then (if >= TIMING_FLOOR_S are left)
#                      label_addition_scale.py --labels 10000000 --new 1000000
#   GPU1, cores 16-31: unseen_labels.py --datasets tags --seeds 0 1 2
#
# Reports under $OUT: deps.md / tags.md (the study's tables, calibration tables included), scale_1e7.md, and
# deps.tgz / tags.tgz (runs/*.json and the workers' logs). The last lines printed are the two tables' heads.
#
# CPU dry run of the plumbing (paths, wheels, the commands each GPU would run; nothing is trained):
#   bash benchmarks/unseen_labels_call.sh --dry-run        (from the worktree root, or from the repository root)
set -uo pipefail
started=$SECONDS
WALL_S=${WALL_S:-530}          # the whole call, setup and packing included
STUDY_BUDGET_S=${STUDY_BUDGET_S:-430}
TIMING_FLOOR_S=${TIMING_FLOOR_S:-60}
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
tree=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)   # the worktree (.wt/calib on the device)
root=$(cd "$tree/../.." && pwd)                           # the repository root: .device-data, .whl
data=$root/.device-data
out=${OUT:-/tmp/unseen_labels_call_out}
mkdir -p "$out"
missing=0
for path in "$data/debian-xmc/deps" "$data/debian-xmc/tags" "$data/minilm-int8" "$tree/benchmarks/unseen_labels.py"; do
  [ -e "$path" ] || { echo "missing: $path (carry it: see the head of this script)"; missing=1; }
done
ls "$root"/.whl/*.whl > /dev/null 2>&1 || { echo "missing: $root/.whl/*.whl"; missing=1; }
if [ $dry = 1 ]; then
  echo "dry run: worktree $tree, repository root $root, out $out, missing paths: $missing"
  run() { echo "  would run: $*"; }
else
  [ $missing = 0 ] || exit 2
  run() { "$@"; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$root"/.whl/*.whl
fi
export PYTHONPATH=$tree:/tmp/site PYTHONUNBUFFERED=1
[ $dry = 1 ] || python3 -c "import datasets, torch, transformers; print('torch', torch.__version__, 'transformers',
    transformers.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])" \
    | tee "$out/env.txt"
echo "commit: ${HASTE_COMMIT:-not given (pass HASTE_COMMIT=<the calib commit>)}" | tee -a "$out/env.txt"

study() {  # study GPU DATASET
  local gpu=$1 dataset=$2 cores="$((16 * $1))-$((16 * $1 + 15))"
  CUDA_VISIBLE_DEVICES=$gpu run taskset -c "$cores" timeout $((STUDY_BUDGET_S + 30)) python3 \
    "$tree/benchmarks/unseen_labels.py" --data-root "$data/debian-xmc" --datasets "$dataset" --seeds 0 1 2 \
    --encoder "$data/minilm-int8" --work-dir "/tmp/ulw-$dataset" --out "/tmp/ulo-$dataset" --budget-s "$STUDY_BUDGET_S" \
    > "$out/$dataset.log" 2>&1
  run cp "/tmp/ulo-$dataset/table.md" "$out/$dataset.md"
  run tar -czf "$out/$dataset.tgz" -C "/tmp/ulo-$dataset" runs
}

(
  cd "$tree" || exit 1
  study 0 deps
  left=$((WALL_S - (SECONDS - started) - 15))
  if [ $left -ge "$TIMING_FLOOR_S" ]; then
    CUDA_VISIBLE_DEVICES=0 run taskset -c 0-15 timeout $left python3 "$tree/benchmarks/label_addition_scale.py" \
      --labels 10000000 --new 1000000 > "$out/scale_1e7.md" 2>&1
    echo "10^7 timing: exit $? after $((SECONDS - started)) s (limit $left s)" >> "$out/scale_1e7.md"
  else
    echo "10^7 timing skipped: $left s left after deps (floor $TIMING_FLOOR_S s)" > "$out/scale_1e7.md"
  fi
) &
( cd "$tree" || exit 1; study 1 tags ) &
wait
echo "=== call wall: $((SECONDS - started)) s"
for name in deps tags; do
  echo "=== $name"; [ -f "$out/$name.md" ] && head -32 "$out/$name.md"; tail -3 "$out/$name.log" 2>/dev/null
done
echo "=== 10^7"; cat "$out/scale_1e7.md" 2>/dev/null
