#!/usr/bin/env bash
# One command for a lent GPU: the set-up of tools/gpu_env.sh, the `gpu`-marked tests and every figure
# docs/GPU.md owes, written as one Markdown report and one JSON file into a folder.
#
#   tools/gpu_report.sh PART [DIR]     PART: tests | kernels | train | all;  DIR: default $OUT, else gpu-report
#
# Each part finishes in under 8 minutes on an H100, so two or three device calls cover everything:
#
#   tests    set-up, `pytest -m gpu`, the GPU profile's kernel tests, host ms per replayed step
#   kernels  matmul fp32 (tuned) / fp16 / bf16 vs torch, attention fwd+bwd vs SDPA, bf16 maps
#   train    alpha-8l and gpt2-124m training tok/s and MFU vs a torch CUDA eager twin, fp32 and bf16
#
# Every part writes DIR/<part>.log (all output) and DIR/<part>.jsonl (each benchmark record, tagged with its
# step, and one {"event": "report_step", ...} per step with its exit code and seconds), then rebuilds
# DIR/report.md and DIR/report.json from every *.jsonl there (tools/gpu_report.py), so four files come back
# per call. On a bare NVIDIA machine carry .gl and .whl (tools/gpu_env.sh bundle) with the checkout.
# HELIOS_REPORT_SETUP=0 skips the set-up (a machine that already has the loader and wheels, or lavapipe).
set -uo pipefail

part="${1:-}"
case "$part" in tests|kernels|train|all) ;; *)
    echo "usage: tools/gpu_report.sh tests|kernels|train|all [DIR]  (see the comment at the top)" >&2; exit 2;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${2:-${OUT:-$root/gpu-report}}"
mkdir -p "$dir" || { echo "gpu_report: cannot create $dir" >&2; exit 2; }
dir="$(cd "$dir" && pwd)"
cd "$root" || exit 2
PY="${PYTHON:-python3}"
STEP_LIMIT="${HELIOS_REPORT_STEP_LIMIT:-420}"  # seconds one step may take; a part stays under 8 minutes

if [ "${HELIOS_REPORT_SETUP:-1}" != 0 ]; then
    # shellcheck source=tools/gpu_env.sh
    source tools/gpu_env.sh > "$dir/setup.log" 2>&1 || { cat "$dir/setup.log" >&2; exit 2; }
fi
export PYTHONUNBUFFERED=1

# step NAME COMMAND...: run it under the step limit, keep its output in the part's log, its JSON records in
# the part's jsonl (tagged with the step), and a report_step record with its exit code and last line.
step() {
    local name="$1"; shift
    local log="$dir/$current.log" jsonl="$dir/$current.jsonl" tmp t0 rc
    tmp="$(mktemp)"
    t0=$(date +%s%N)
    echo "== $name: $*" | tee -a "$log"
    timeout "$STEP_LIMIT" "$@" > "$tmp" 2>&1
    rc=$?
    cat "$tmp" >> "$log"
    "$PY" tools/gpu_report.py --records "$name" "$rc" "$(( ($(date +%s%N) - t0) / 1000000 ))" < "$tmp" >> "$jsonl"
    rm -f "$tmp"
    echo "== $name: exit $rc" | tee -a "$log"
}

run_tests() {
    current=tests
    step info "$PY" -m helios info --json
    step gpu_tests "$PY" -m pytest -m gpu tests/kernels -q -p no:cacheprovider
    step kernel_tests "$PY" -m pytest tests/kernels/test_matmul.py tests/kernels/test_attention.py -q -x \
        -p no:cacheprovider
    step replay "$PY" -m helios.bench replay --json
}

# big enough to fill a GPU's matrix units: squares, and alpha-8l's qkv / mlp-up / mlp-down at B*T = 20*512
HALF_SHAPES=1024x1024x1024,4096x4096x4096,10240x1152x384,10240x1536x384,10240x384x1536

run_kernels() {
    current=kernels
    step tune_matmul "$PY" -m helios.bench tune matmul --json
    step matmul_fp32 "$PY" -m helios.bench matmul --json
    # half precision: the op's choice (the matrix units where the device has them) vs torch in that dtype
    step matmul_fp16 "$PY" -m helios.bench matmul --dtype fp16 --layouts nn,nt,tn --shapes "$HALF_SHAPES" --json
    step matmul_bf16 "$PY" -m helios.bench matmul --dtype bf16 --layouts nn,nt,tn --shapes "$HALF_SHAPES" --json
    step attention "$PY" -m helios.bench attention --json
    step bf16_maps "$PY" -m helios.bench bf16 --json
}

run_train() {
    current=train
    step train_alpha8l "$PY" tools/bench_train.py configs/gpu-alpha-8l.toml --steps 20 --helios-dtypes fp32,bf16,fp16 \
        --torch-dtypes fp32,bf16
    step train_gpt2_124m "$PY" tools/bench_train.py configs/gpu-gpt2-124m.toml --steps 10 --helios-dtypes bf16 \
        --torch-dtypes fp32,bf16
}

case "$part" in
    tests) run_tests;; kernels) run_kernels;; train) run_train;;
    all) run_tests; run_kernels; run_train;;
esac
"$PY" tools/gpu_report.py --report "$dir"
