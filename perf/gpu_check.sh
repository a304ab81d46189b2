#!/usr/bin/env bash
# One prepared GPU check, <= 7 minutes on one H200 (torch + triton + numpy only, nothing
# downloaded): perf/gpu_check.py's sections (kernel correctness, attention A/B, launches and
# drains per round, verify l(n) eager vs captured, AR / chain / CAST@15 / auto rounds at
# B = 1 and 32) on a random-weight Qwen3-8B-shaped target -> $OUT/gpu_check.json (default
# perf/results/gpu_check.json; extra arguments go to perf/gpu_check.py).
# Exit status: 0 all sections ok, 1 a section failed (the report says which), 124 the time
# guard fired (sections done so far are kept in the report).
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-perf/results}"
mkdir -p "$out_dir"
unset TRITON_INTERPRET  # compiled kernels on the GPU, never the interpreter
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
status=0
timeout 400 python -m perf.gpu_check --out "$out_dir/gpu_check.json" "$@" || status=$?
exit "$status"
