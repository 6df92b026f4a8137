# Copyright 2026 The haste_hf Authors. Apache-2.0.
# Sourced by the device call scripts (scale_call.sh, scale_100m_call.sh, quality_call.sh, grouping_ab_call.sh) from
# the root of this tree: the wheels the device lacks (datasets, dill, multiprocess) into /tmp/site, PYTHONPATH, the
# versions and the commit (HASTE_COMMIT: the device's copy has no git), the int8-packed MiniLM unpacked into
# $encoder (/tmp/minilm), $out ($OUT or /tmp/scale-out). Git-ignored inputs are read from this tree or from the
# checkout around it (../../, where a worktree sits in .wt/): `find_asset NAME`.
started=${started:-$SECONDS}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=${OUT:-/tmp/scale-out}
mkdir -p "$out"
find_asset() {  # the ignored folder $1 of this tree, or of the checkout around it
    local root
    for root in . ../..; do
        if [ -e "$root/$1" ]; then (cd "$root/$1" && pwd) && return; fi
    done
    echo "missing: $1 (in this tree or ../..)" >&2 && return 1
}
if ! python3 -c "import datasets" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$(find_asset .whl)"/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import datasets, torch, transformers; print('datasets', datasets.__version__, 'torch', torch.__version__,
    'transformers', transformers.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])"
echo "commit: ${HASTE_COMMIT:-not given (pass HASTE_COMMIT)}"
encoder=/tmp/minilm
[ -f "$encoder/model.safetensors" ] || python3 benchmarks/int8_transit.py unpack "$(find_asset .device-data/minilm-int8)" "$encoder"
card=$(python3 -c "
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'
print(next((k for k in ('h100', 'h200') if k in name.lower()), 'cpu' if name == 'cpu' else 'gpu'))")
