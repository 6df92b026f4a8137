#!/usr/bin/env bash
# One device call of issue 38: the Triton kernels against the CUDA build on one GPU, in one run.
#
#   bash benchmarks/triton_call.sh OUT_DIR [kernels.py grid arguments...]
#
# Steps (each one's output under OUT_DIR; a short table printed last):
#   1. the CUDA build (timed) into a cache folder; a tarball of it that a later call unpacks ($CUDA_BUILD_TARBALL)
#      instead of building again;
#   2. `first_use.py --backends triton` (item 3: first use on an empty cache, then a later process);
#   3. `step.py` at 8.6M labels (HASTE) with the CUDA build, then with Triton in an environment whose PATH holds no
#      nvcc and no ninja (what `pip install torch` gives), `predict_topk` throughput included;
#   4. `pytest tests/kernels/triton` (or the files in $TESTS) on the GPU when
#      $RUN_TESTS=1;
#   5. `triton_loss_sweep.py` over the shapes in $LOSS_SWEEP, if any;
#   6. `kernels.py` over the grid given (both backends side by side), stopped after $GRID_SECONDS.
set -uo pipefail
out=${1:?usage: triton_call.sh OUT_DIR [kernels.py arguments]}
shift
mkdir -p "$out"
python=$(command -v python3)
cache=/tmp/haste_hf_kernel_cache
export HASTE_HF_KERNEL_CACHE=$cache
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
"$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/machine.txt"

# 1. The CUDA build: unpacked from an earlier call's tarball when given (sources older than the objects: ninja
#    finds nothing to do), else built.
if [ -n "${CUDA_BUILD_TARBALL:-}" ] && [ -f "$CUDA_BUILD_TARBALL" ]; then
    mkdir -p "$cache" && tar -xzf "$CUDA_BUILD_TARBALL" -C "$cache" && touch -d '2000-01-01' csrc/*
fi
start=$(date +%s%N)
HASTE_HF_KERNELS=cuda "$python" -c "
from haste_hf.kernels import ops
assert ops.is_available(), 'the CUDA build failed'"
echo "cuda build or load: $((($(date +%s%N) - start) / 1000000)) ms" | tee -a "$out/machine.txt"
if [ -z "${CUDA_BUILD_TARBALL:-}" ]; then
    tar -czf "$out/cuda_build.tgz" -C "$cache" . && ls -la "$out/cuda_build.tgz"
fi

# 2. First use of the Triton kernels.
timeout 120 "$python" benchmarks/first_use.py --backends triton --out "$out/first_use.md" 2>&1 | tail -4

# 3. The training step and predict_topk, CUDA build then Triton with no nvcc or ninja on PATH.
step="benchmarks/step.py --labels 8.6 --variants HASTE --warmup 2 --repeats ${STEP_REPEATS:-7}"
HASTE_HF_KERNELS=cuda timeout 200 "$python" $step --title "CUDA build" --out "$out/step_cuda.md" 2>&1 | tail -3
# PATH without nvcc and ninja: each PATH folder that holds one is replaced by a folder of links to its other entries.
shadow=/tmp/path_without_toolchain
rm -rf "$shadow"
bare_path=""
IFS=: read -ra folders <<<"$PATH"
for folder in "${folders[@]}"; do
    if [ -e "$folder/nvcc" ] || [ -e "$folder/ninja" ]; then
        copy="$shadow/$(echo "$folder" | tr / _)"
        mkdir -p "$copy"
        for entry in "$folder"/*; do
            case "$(basename "$entry")" in nvcc | ninja) ;; *) ln -s "$entry" "$copy/" ;; esac
        done
        folder=$copy
    fi
    bare_path="$bare_path${bare_path:+:}$folder"
done
env -u HASTE_HF_KERNELS PATH="$bare_path" bash -c 'echo "no toolchain: nvcc=$(command -v nvcc) ninja=$(command -v ninja)"' |
    tee -a "$out/machine.txt"
env -u HASTE_HF_KERNELS PATH="$bare_path" timeout 200 "$python" $step --title "Triton, no nvcc or ninja on PATH" \
    --out "$out/step_triton.md" 2>&1 | tail -3

# 4. The Triton kernels' tests on the GPU.
if [ "${RUN_TESTS:-0}" = 1 ]; then
    timeout 240 "$python" -m pytest -q -p no:cacheprovider ${TESTS:-tests/kernels/triton} \
        2>&1 | tail -5 | tee "$out/tests.txt"
fi

# 5. The fused loss's launch configurations ($LOSS_SWEEP: triton_loss_sweep.py's --shapes, none when empty).
if [ -n "${LOSS_SWEEP:-}" ]; then
    timeout 150 "$python" benchmarks/triton_loss_sweep.py --shapes $LOSS_SWEEP --out "$out/loss_sweep.txt" 2>&1 | tail -3
fi

# 6. The kernels' grid, both backends side by side.
timeout "${GRID_SECONDS:-200}" "$python" benchmarks/kernels.py "$@" 2>&1 | tee "$out/kernels.txt" |
    grep -v "^ *[0-9]" | tail -20

echo "=== summary"
cat "$out/machine.txt"
cat "$out/first_use.md" 2>/dev/null
grep -v "^#" "$out/loss_sweep.txt" 2>/dev/null
cat "$out/step_cuda.md" "$out/step_triton.md" 2>/dev/null | grep "8.6M"
"$python" benchmarks/kernels.py --summarize "$out/kernels.txt"
