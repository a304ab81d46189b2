#!/usr/bin/env bash
# The main job: CAST decoding on the embedded default (SmolLM2-135M-Instruct + DFlash head).
# Extra arguments go to `cast-trtllm generate` (see `cast-trtllm generate --help`).
set -euo pipefail
source "$(dirname "$0")/scripts/bootstrap.sh"
if [ "$#" -eq 0 ]; then
  set -- --prompt "Write a Python function that returns the n-th Fibonacci number." \
         --method cast --budget auto --max-new-tokens 96
fi
exec cast-trtllm generate "$@"
