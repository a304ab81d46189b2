#!/usr/bin/env bash
# AIPerf 0.13.0 (NVIDIA's trtllm-serve benchmark client) against `cast-trtllm serve --api openai`:
# AR, cast:3 and cast:auto as per-request `cast` options on ONE server, chat + streaming, synthetic
# prompts, ignore_eos; the method order rotates per repeat at each concurrency. Issue 40.
#
#   perf/aiperf_run.sh OUT_DIR            (LEVELS="1 8 16" REQUESTS=16 PER_SLOT=8 ISL=100 OSL=24 REPEATS=5
#                                          METHODS="ar cast3 auto")
#
# Each run sends max(REQUESTS, PER_SLOT x c) requests, so that at every level requests join as others
# finish (continuous arrivals): at c = 16, 16 requests are one burst whose 16 prefills take half its
# time. Runs are short and this client shares the server's cores: at c = 8, 32 requests x 3 repeats
# (runs of ~15 s, 2-core CPU) moved 10% apart and read auto 0.92x AR; 64 x 5 read 1.01x (paired 1.012).
# After each run the server's /metrics is kept in the run's folder: `perf/aiperf_summary.py` reads from
# the counters' steps how often each run drafted.
#
# AIPerf lives in its own virtual environment ($AIPERF_VENV, made here on first use): it is a
# benchmark client, never a dependency of the runtime. It needs a tokenizer folder (the embedded
# one, saved with save_pretrained), must run with HF_HUB_OFFLINE unset (0.13 takes a local path
# for a hub id and fails otherwise), and writes CSV lines ending in CR LF (perf/aiperf_summary.py).
# The server listens on 127.0.0.1 only.
set -euo pipefail
OUT=${1:?usage: perf/aiperf_run.sh OUT_DIR}
LEVELS=${LEVELS:-"1 8 16"}; REQUESTS=${REQUESTS:-16}; PER_SLOT=${PER_SLOT:-8}; ISL=${ISL:-100}; OSL=${OSL:-24}; REPEATS=${REPEATS:-5}
read -r -a ORDER <<< "${METHODS:-ar cast3 auto}"
VENV=${AIPERF_VENV:-$HOME/.cache/cast-trtllm/aiperf-venv}
PY=${PYTHON:-python}
if [ ! -x "$VENV/bin/aiperf" ]; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q aiperf==0.13.0
fi
mkdir -p "$OUT"
rm -f "$OUT/order.txt"
echo "LEVELS=\"$LEVELS\" REQUESTS=$REQUESTS PER_SLOT=$PER_SLOT ISL=$ISL OSL=$OSL REPEATS=$REPEATS METHODS=\"${ORDER[*]}\" perf/aiperf_run.sh OUT (code \
$(git rev-parse --short HEAD 2>/dev/null || echo unknown), load average at start $(cut -d' ' -f1-3 /proc/loadavg))" \
  > "$OUT/command.txt"
[ -f "$OUT/tokenizer/tokenizer_config.json" ] || "$PY" -c "
from runtime.loader import load_hf_checkpoint
load_hf_checkpoint('embedded').tokenizer.save_pretrained('$OUT/tokenizer')"
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
TQDM_DISABLE=1 "$PY" -c "from cast_trtllm.cli import main; main()" serve --api openai --host 127.0.0.1 \
  --port "$PORT" --max-batch 16 --max-queue 64 --log-level warning > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/v1/models" > "$OUT/models.json" && break; sleep 1; done
MODEL=$("$PY" -c "import json; print(json.load(open('$OUT/models.json'))['data'][0]['id'])")
declare -A BODY=([ar]='{"cast": {"method": "ar"}, "ignore_eos": true}'
                 [cast3]='{"cast": {"method": "cast", "budget": 3}, "ignore_eos": true}'
                 [auto]='{"ignore_eos": true}')
for m in "${ORDER[@]}"; do
  [ -n "${BODY[$m]+set}" ] || { echo "METHODS: unknown method '$m' (choose from: ${!BODY[*]})" >&2; exit 2; }
done
for c in $LEVELS; do
  n=$(( PER_SLOT * c > REQUESTS ? PER_SLOT * c : REQUESTS ))
  for r in $(seq 0 $((REPEATS - 1))); do
    for i in "${!ORDER[@]}"; do
      m=${ORDER[$(( (i + r) % ${#ORDER[@]} ))]}
      echo "c=$c repeat $r $m" >&2
      env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE "$VENV/bin/aiperf" profile --model "$MODEL" \
        --url "http://127.0.0.1:$PORT" --endpoint-type chat --streaming --concurrency "$c" \
        --request-count "$n" --prompt-input-tokens-mean "$ISL" --prompt-input-tokens-stddev 0 \
        --output-tokens-mean "$OSL" --output-tokens-stddev 0 --extra-inputs "${BODY[$m]}" \
        --tokenizer "$OUT/tokenizer" --random-seed 0 --ui-type none \
        --artifact-dir "$OUT/c$c-$m-r$r" > "$OUT/c$c-$m-r$r.log" 2>&1
      curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/c$c-$m-r$r/server_metrics.txt"
      echo "c$c-$m-r$r" >> "$OUT/order.txt"
    done
  done
done
curl -s "http://127.0.0.1:$PORT/metrics" > "$OUT/metrics.txt" || true
"$PY" -m perf.aiperf_summary "$OUT"
