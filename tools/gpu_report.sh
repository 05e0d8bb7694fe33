#!/usr/bin/env bash
# One device call for a lent GPU: the set-up of tools/gpu_env.sh, then the figures docs/GPU.md owes, most
# valuable first, inside one time budget, each written into a folder as soon as it is measured.
#
#   tools/gpu_report.sh PART [DIR]     PART: all | train | kernels | tests;  DIR: default $OUT, else gpu-report
#
#   all      (one call, under 9 minutes) 1. alpha-8l training tok/s, helios bf16 then fp32/fp16, vs torch
#            (CUDA fp32 TF32-off and bf16; torch CPU fp32 without CUDA), 2. matmul fp32, fp16, bf16 vs torch,
#            3. attention fwd+bwd vs SDPA, 4. the matmul tuner, tuned beside the table's tiling, 5. pytest -m gpu
#   train    the same training figures and gpt2-124m's     } extras for a second call when device time is
#   kernels  the kernel figures and the bf16 maps          } left; each runs under the same budget
#   tests    pytest -m gpu, the matmul/attention tests, host ms per replayed step
#
# The budget, GPU_REPORT_BUDGET_S seconds (default 510, so a device call with timeout_s 540 never cuts the
# script), counts from the start, set-up included. Each step runs under `timeout`, with a share of what is
# left in proportion to its weight (at least GPU_REPORT_MIN_STEP_S, default 10, never past the budget); a
# step is skipped, with a line saying so, once less than GPU_REPORT_MIN_STEP_S is left.
#
# Written as it goes, so a call cut off at its limit still returns what it measured:
#   DIR/<step>.log     the step's output, streamed
#   DIR/<step>.jsonl   after the step: its JSON records tagged with the step, and one
#                      {"event": "report_step", "status": ok|failed|cut|skipped, "rc", "seconds", "limit_s", ...}
#   DIR/index.txt      the plan, then one line per step as it ends or is skipped
#   DIR/report.md, DIR/report.json   rebuilt from every DIR/*.jsonl after each step (tools/gpu_report.py)
#
# Exit code: 0 every step ran and exited 0; 1 a step failed; 3 none failed but the budget cut or skipped some;
# 2 usage or set-up error.
# Environment: HELIOS_REPORT_SETUP=0 skips the set-up (lavapipe, or a machine already set up; on a bare NVIDIA
# machine carry .gl and .whl, from `tools/gpu_env.sh bundle`, with the checkout). GPU_REPORT_QUICK=1 runs tiny
# sizes (the lavapipe end-to-end test). GPU_REPORT_TORCH=cuda|cpu|none overrides the torch side of training
# (default: cuda where torch sees one; else cpu, or none with GPU_REPORT_QUICK). PYTHON: the interpreter.
set -uo pipefail

part="${1:-}"
case "$part" in all|train|kernels|tests) ;; *)
    echo "usage: tools/gpu_report.sh all|train|kernels|tests [DIR]  (see the comment at the top)" >&2; exit 2;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${2:-${OUT:-$root/gpu-report}}"
mkdir -p "$dir" || { echo "gpu_report: cannot create $dir" >&2; exit 2; }
dir="$(cd "$dir" && pwd)"
cd "$root" || exit 2
PY="${PYTHON:-python3}"
BUDGET="${GPU_REPORT_BUDGET_S:-510}"
MIN_STEP="${GPU_REPORT_MIN_STEP_S:-10}"
QUICK="${GPU_REPORT_QUICK:-0}"
KILL_AFTER=5  # seconds between timeout's TERM and its KILL; counted in the budget
index="$dir/index.txt"
SECONDS=0  # the budget counts from here

note() { echo "$*" | tee -a "$index"; }

note "# tools/gpu_report.sh $part: budget ${BUDGET} s, min step ${MIN_STEP} s, quick=${QUICK}, $(date -u +%FT%TZ)"
if [ "${HELIOS_REPORT_SETUP:-1}" != 0 ]; then
    # shellcheck source=tools/gpu_env.sh
    source tools/gpu_env.sh > "$dir/setup.log" 2>&1 || { cat "$dir/setup.log" >&2; note "set-up failed"; exit 2; }
    note "set-up: ${SECONDS} s"
fi
export PYTHONUNBUFFERED=1

torch="${GPU_REPORT_TORCH:-}"
if [ -z "$torch" ] && [ "$part" != tests ] && [ "$part" != kernels ]; then
    if [ "$QUICK" != 0 ]; then torch=none
    elif timeout 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null
    then torch=cuda
    else torch=cpu
    fi
fi
case "$torch" in
    cuda) train_torch=(--torch-device cuda --torch-dtypes "fp32,bf16")
          torch_fp32=(--torch-device cuda --torch-dtypes fp32);;
    cpu) train_torch=(--torch-device cpu --torch-dtypes fp32); torch_fp32=("${train_torch[@]}");;
    *) train_torch=(--torch-dtypes ''); torch_fp32=("${train_torch[@]}");;
esac

# The plan: names, weights and commands (each command one shell-quoted string), in the order they run.
names=(); weights=(); commands=()
plan() {
    local name="$1" weight="$2" cmd
    shift 2
    printf -v cmd '%q ' "$@"
    names+=("$name"); weights+=("$weight"); commands+=("$cmd")
}

# big enough to fill a GPU's matrix units: squares, and alpha-8l's qkv / mlp-up / mlp-down at B*T = 20*512
HALF_SHAPES=1024x1024x1024,4096x4096x4096,10240x1152x384,10240x1536x384,10240x384x1536
if [ "$QUICK" != 0 ]; then
    alpha=(configs/shakespeare.toml --steps 2 --warmup 1); gpt2=("${alpha[@]}")
    mm_fp32=(--shapes 128x128x128 --repeats 2); mm_half=(--layouts nn --shapes 128x128x128 --repeats 2)
    attn=(--quick --repeats 2); tune=(--shapes 128x128x128 --layouts nn --quick --dry-run)
else
    alpha=(configs/gpu-alpha-8l.toml --steps 10); gpt2=(configs/gpu-gpt2-124m.toml --steps 10)
    mm_fp32=(); mm_half=(--layouts "nn,nt,tn" --shapes "$HALF_SHAPES"); attn=(); tune=()
fi
# the tuner's records, then one tune_vs_table record per shape: the tuned winner beside the table's tiling
# shellcheck disable=SC2016  # expanded by the inner bash: $0 is the interpreter, $@ the tuner's options
tune_cmd=(bash -c '"$0" -m helios.bench tune matmul --json "$@" | "$0" tools/gpu_report.py --tune-vs-table' "$PY")

plan info 0.2 "$PY" -m helios info --json
case "$part" in all|train)
    plan train_bf16 4 "$PY" tools/bench_train.py "${alpha[@]}" --helios-dtypes bf16 "${train_torch[@]}"
    plan train_fp32_fp16 2 "$PY" tools/bench_train.py "${alpha[@]}" --helios-dtypes fp32,fp16 "${torch_fp32[@]}";;
esac
[ "$part" = train ] && plan train_gpt2_124m 3 "$PY" tools/bench_train.py "${gpt2[@]}" --helios-dtypes bf16 \
    "${train_torch[@]}"
case "$part" in all|kernels)
    plan matmul_fp32 1.5 "$PY" -m helios.bench matmul --json "${mm_fp32[@]}"
    plan matmul_fp16 1 "$PY" -m helios.bench matmul --dtype fp16 --json "${mm_half[@]}"
    plan matmul_bf16 1 "$PY" -m helios.bench matmul --dtype bf16 --json "${mm_half[@]}"
    plan attention 1.5 "$PY" -m helios.bench attention --json "${attn[@]}"
    plan tune_matmul 1.5 "${tune_cmd[@]}" "${tune[@]}";;
esac
[ "$part" = kernels ] && plan bf16_maps 1 "$PY" -m helios.bench bf16 --json
case "$part" in all|tests) plan gpu_tests 1.5 "$PY" -m pytest -m gpu tests/kernels -q -p no:cacheprovider;; esac
if [ "$part" = tests ]; then
    plan kernel_tests 2 "$PY" -m pytest tests/kernels/matmul/test_matmul.py tests/kernels/attention/test_attention.py -q -x \
        -p no:cacheprovider
    plan replay 1 "$PY" -m helios.bench replay --json
fi
note "plan: ${names[*]}"

failed=0; short=0
for i in "${!names[@]}"; do
    name="${names[$i]}"
    left=$(( BUDGET - SECONDS - KILL_AFTER ))
    if [ "$left" -lt "$MIN_STEP" ]; then
        note "$name: skipped, budget spent (at ${SECONDS} s of ${BUDGET} s: ${left} s left after ${KILL_AFTER} s kept" \
             "for a kill; a step gets >= ${MIN_STEP} s)"
        "$PY" tools/gpu_report.py --skipped "$name" "budget spent at ${SECONDS} s of ${BUDGET} s" > "$dir/$name.jsonl"
        short=1
        continue
    fi
    # this step's share of what is left: its weight over the weights of the steps still to run
    limit=$(awk -v left="$left" -v min="$MIN_STEP" -v i="$i" -v ws="${weights[*]}" 'BEGIN {
        n = split(ws, w, " "); rest = 0; for (j = i + 1; j <= n; j++) rest += w[j]
        s = int(left * w[i + 1] / rest); if (s < min) s = min; if (s > left) s = left; print s }')
    log="$dir/$name.log"
    echo "== $name (limit ${limit} s): ${commands[$i]}" > "$log"
    t0=$(date +%s%N)
    eval "timeout --kill-after=$KILL_AFTER $limit ${commands[$i]}" >> "$log" 2>&1
    rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    "$PY" tools/gpu_report.py --records "$name" "$rc" "$ms" --limit "$limit" < "$log" > "$dir/$name.jsonl"
    case "$rc" in 0) status="ok";; 124|137) status="cut"; short=1;; *) status="failed"; failed=1;; esac
    last="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-200)"
    note "$name: $status, exit $rc, $(( ms / 1000 )) s of ${limit} s | $last"
    "$PY" tools/gpu_report.py --report "$dir" > /dev/null
done
"$PY" tools/gpu_report.py --report "$dir" | tee -a "$index"
note "done in ${SECONDS} s"
[ "$failed" = 1 ] && exit 1
[ "$short" = 1 ] && exit 3
exit 0
