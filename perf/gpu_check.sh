#!/usr/bin/env bash
# One prepared GPU check, <= 8 minutes on one H200 (torch + triton only, nothing downloaded):
# tree-attention kernel correctness vs the torch reference (fp32/bf16/fp16, ragged, GQA),
# kernel vs SDPA-with-dense-mask timings, and the Qwen3-8B-shaped verify-latency probe
# (paper Table 5 protocol) as a width profile -> $OUT/gpu_check.json (default
# perf/results/gpu_check.json; extra arguments go to perf/gpu_check.py); then its round_loop
# section, the whole round loop of the one engine on a random-weight Qwen3-8B-shaped target
# with a drafter of controlled acceptance (AR / chain / CAST@15 / CAST auto ms per token, R,
# host overhead) -> $OUT/gpu_round_loop.json. Exit status: 0 all sections ok, 1 a section failed (the
# report says which), 124 a time guard fired (sections done so far are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-perf/results}"
mkdir -p "$out_dir"
unset TRITON_INTERPRET  # compiled kernels on the GPU, never the interpreter
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
timeout 330 python -m perf.gpu_check --out "$out_dir/gpu_check.json" "$@" || status=$?
timeout 140 python -m perf.gpu_check --sections round_loop --out "$out_dir/gpu_round_loop.json" || status=$?
exit "$status"
