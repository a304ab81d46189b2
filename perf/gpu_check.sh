#!/usr/bin/env bash
# One prepared GPU check, <= 8 minutes on one H200 (torch + triton only, nothing downloaded):
# tree-attention kernel correctness vs the torch reference (fp32/bf16/fp16, ragged, GQA),
# kernel vs SDPA-with-dense-mask timings, and the Qwen3-8B-shaped verify-latency probe
# (paper Table 5 protocol) as a width profile. Writes ONE report: $OUT/gpu_check.json
# (default perf/results/gpu_check.json). Extra arguments go to perf/gpu_check.py
# (see `python -m perf.gpu_check --help`). Exit status: 0 all sections ok, 1 a section
# failed (the report says which), 124 the 470 s guard fired (sections done so far are kept).
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir="${OUT:-perf/results}"
mkdir -p "$out_dir"
unset TRITON_INTERPRET  # compiled kernels on the GPU, never the interpreter
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION="${TRITON_DEFAULT_FP_FUSION:-1}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
timeout 470 python -m perf.gpu_check --out "$out_dir/gpu_check.json" "$@"
