#!/usr/bin/env bash
# Copyright 2026 The haste_hf Authors. Apache-2.0.
# One call on a machine of several GPUs (<= 570 s; issue 42 item 2): the largest label count whose training step
# runs on all its GPUs with the output layer sharded by labels and every memory option of the plan on (bf16
# momentum, chunked loss backward, fused update, encoder checkpointing), up to 10^9: `distributed.py --mode real`
# (a MiniLM-sized random encoder: d 384, 6 layers; G 16, F 64, head 3%; 128 texts x 128 tokens a GPU), one step's
# time (median of 5) and each rank's peak. Counts are tried from the largest down; a count whose planned host
# memory (each rank builds only its share of the output layer, in bf16, and holds the label positions whole: 8 bytes
# a label, twice while they are built) or planned per-rank GPU memory (bf16 weights and momentum of its share, the
# label positions and their inverse whole: 16 bytes a label) does not fit is not started, and the table says so.
#
#   bash benchmarks/largest_labels_call.sh [distributed.py flags]   # one process a visible GPU
#   NPROC=2 LABEL_COUNTS=2e4,1e4 bash benchmarks/largest_labels_call.sh --hidden 64 --layers 2 --seq-len 16 --batch 4
#                                                                   # a CPU dry run (gloo)
# Inputs, HASTE_COMMIT and $OUT as in scale_call.sh (`call_setup.sh`; the encoder is not read).
set -uo pipefail
started=$SECONDS
source benchmarks/call_setup.sh || exit 1
python3 - "$out" "$started" "$SECONDS" "$@" <<'PYEOF' | tee "$out/largest_labels_${card}.md"
import os, subprocess, sys, time

out, extra = sys.argv[1], sys.argv[4:]
deadline = time.time() + 555 - (int(sys.argv[3]) - int(sys.argv[2]))
import torch

gpus = int(os.environ.get("NPROC") or max(1, torch.cuda.device_count()))
gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 8 * 2**30
host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
fan_in, group, head, hidden = 64, 16, 0.03, 384
rows = []
print(f"# {gpus} x {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}, host {host_bytes / 2**30:.0f} GiB, "
      f"commit {os.environ.get('HASTE_COMMIT', 'not given')}; G {group}, F {fan_in}, head {head:.0%}, d {hidden}")
print("\n| labels | planned host GiB (all ranks) | planned GiB a rank | outcome | step ms | texts/s | peak GiB per rank |")
print("|---|---|---|---|---|---|---|")
counts = os.environ.get("LABEL_COUNTS", "1e9,7.5e8,5e8,3.5e8,2.5e8,1.75e8,1.25e8,1e8")
failed_logs = 0
for labels in [int(float(count)) for count in counts.split(",")]:
    weights = labels * (1 - head) * fan_in + labels * head * hidden  # tail and head
    host = (2 * weights + gpus * 16 * labels) * 1.2  # bf16 shares, label positions a rank; 20% for the rest
    rank = 4 * weights / gpus + 16 * labels + 4 * 2**30  # bf16 weight + momentum, positions both ways; encoder etc.
    planned = f"| {labels:,} | {host / 2**30:,.0f} | {rank / 2**30:,.1f} |"
    if host > 0.85 * host_bytes or rank > 0.85 * gpu_bytes:
        print(f"{planned} not started: over {'host' if host > 0.85 * host_bytes else 'GPU'} memory | - | - | - |", flush=True)
        continue
    left = deadline - time.time()
    if left < 60:
        print(f"{planned} not started: {left:.0f} s of the call left | - | - | - |", flush=True)
        break
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
               "benchmarks/distributed.py", "--mode", "real", "--labels", str(labels), "--group-size", str(group),
               "--fan-in", str(fan_in), "--head-fraction", str(head), "--hidden", str(hidden), "--layers", "6",
               "--heads", "12", "--vocab", "30522", "--batch", "128", "--seq-len", "128", "--steps", "5",
               "--momentum-dtype", "bfloat16", "--fused-update", "--gradient-checkpointing",
               "--out", f"/tmp/largest-{labels}.txt", *extra]
    if not torch.cuda.is_available():
        command += ["--device", "cpu"]
    log = open(f"/tmp/largest-{labels}.log", "w")
    began = time.time()
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = process.wait(timeout=left - 5)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        code = "killed at the call's end"
    log.close()
    seconds = time.time() - began
    result = open(f"/tmp/largest-{labels}.txt").read() if code == 0 and os.path.exists(f"/tmp/largest-{labels}.txt") else ""
    if result:
        line = result.strip().splitlines()[-1]  # step X ms (slowest rank), N texts/s, peak memory per rank (MiB): a, b
        step = line.split(" ms")[0].split()[-1]
        speed = line.split(" texts/s")[0].split()[-1]
        peaks = ", ".join(f"{float(v.replace(',', '')) / 1024:.1f}" for v in line.split("(MiB): ")[1].split(", "))
        print(f"{planned} trained ({seconds:.0f} s with the set-up) | {step} | {speed} | {peaks} |", flush=True)
        os.system(f"cp /tmp/largest-{labels}.txt {out}/largest_labels_step.txt")
        break
    tail_lines = open(f"/tmp/largest-{labels}.log", errors="replace").read().strip().splitlines()[-3:]
    reason = next((l for l in reversed(tail_lines) if "Error" in l or "error" in l), tail_lines[-1] if tail_lines else "")
    print(f"{planned} FAILED ({code}, {seconds:.0f} s): {reason[:160]} | - | - | - |", flush=True)
    if failed_logs < 3:  # $OUT brings back 8 files
        failed_logs += 1
        os.system(f"cp /tmp/largest-{labels}.log {out}/largest_labels_failed_{labels}.log")
PYEOF
echo "wall of the call: $((SECONDS - started)) s"
