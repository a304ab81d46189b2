#!/usr/bin/env bash
# The committed CPU measurements of the shipped head, in the order they were taken on a
# 2-core machine (each figure is a side-by-side run; one torch thread per pinned core):
#   1. held-out continuations (GSM8K test, HumanEval, MT-Bench; 40 each) for the replay report
#   2. verify-cost probe of this CPU (core 0)  ||  drafter-training lever speeds (core 1)
#   3. acceptance report (greedy replay, chain R and CAST R per budget, depth-1 reliability)
#   4. width sweep, 20 prompts x 128 tokens per domain (AR, chain, CAST N = 1..63, auto with and
#      without the draft gate), sharded over the two cores by measured cost (about 80 minutes)
#   5. the draft gate beside AR, chain and N = 1 (ONLY_GATE=1 runs just this step; about 30 minutes)
# Uses the shipped head and $WORK (default /tmp/dflash_train) for caches. About 100 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
WORK="${WORK:-/tmp/dflash_train}"
R=perf/results
PROFILE=cast_trtllm/profiles/measured/cpu-smollm2-135m-fp32.json
export OMP_NUM_THREADS=1
SWEEP_PROMPTS="${SWEEP_PROMPTS:-20}"  # per domain; the committed sweep used 10 (time box of the session)

if [ "${ONLY_SWEEP:-0}" != 1 ]; then

[ -d "$WORK/heldout/mt_bench" ] || cast-trtllm train-drafter heldout --work "$WORK" --threads 2

taskset -c 0 cast-trtllm probe --sku cpu --target embedded --prefix 256,512 \
  --packed 1,2,4,8,16,24,32,48,64,96,128 --warmup 4 --iters 20 --threads 1 --no-progress \
  --note "pinned to core 0 while drafter_builder.train_speed ran on core 1" --out "$R/probe_cpu_smollm2_fp32.json" &
taskset -c 1 python -m drafter_builder.train_speed --work "$WORK" --threads 1 --json "$R/drafter_train_speed.json" &
wait
cp "$R/probe_cpu_smollm2_fp32.json" "$PROFILE"

cast-trtllm train-drafter report --work "$WORK" --threads 2 --json "$R/drafter/acceptance_report.json" \
  --plot "$R/drafter/acceptance_report.png" --training-curve "$R/drafter/training_curve.png" \
  | tee "$R/drafter/acceptance_report.txt"
fi

sweep() {  # core, budgets, domain, output stem, extra flags (prompt shard)
  taskset -c "$1" cast-trtllm sweep --dataset "$3" --budgets "$2" --max-new-tokens 128 \
    --width-profile "$PROFILE" --no-progress --report-json "$WORK/$4.json" "${@:5}" > "$WORK/$4.txt"
}

if [ "${ONLY_GATE:-0}" != 1 ]; then
B=1,3,7,15,31,63
# Balanced by measured cost (mt_bench > humaneval > gsm8k per prompt): HumanEval is split by prompt.
HE_SPLIT=$(( SWEEP_PROMPTS * 3 / 10 ))
(sweep 0 $B humaneval sweep_he_a --num-prompts "$HE_SPLIT"
 sweep 0 $B mt_bench sweep_mt --num-prompts "$SWEEP_PROMPTS") &
(sweep 1 $B gsm8k sweep_gsm --num-prompts "$SWEEP_PROMPTS"
 sweep 1 $B humaneval sweep_he_b --num-prompts "$SWEEP_PROMPTS" --skip-prompts "$HE_SPLIT") &
wait
python -m perf.sweep_merge "$WORK"/sweep_{gsm,he_a,he_b,mt}.json --out "$R/width_sweep_cpu.json" \
  --plot "$R/width_sweep_cpu.png" | tee "$R/width_sweep_cpu.table.md"
fi

# 5. The draft gate beside the swept optimum (N = 1 on this CPU): AR, chain, N = 1, auto, auto-ungated,
#    20 prompts per domain, sharded over the two cores by measured cost (about 30 minutes)
HE_GATE=$(( SWEEP_PROMPTS * 4 / 10 ))
(sweep 0 1 mt_bench gate_mt --num-prompts "$SWEEP_PROMPTS"
 sweep 0 1 humaneval gate_he_a --num-prompts "$HE_GATE") &
(sweep 1 1 gsm8k gate_gsm --num-prompts "$SWEEP_PROMPTS"
 sweep 1 1 humaneval gate_he_b --num-prompts "$SWEEP_PROMPTS" --skip-prompts "$HE_GATE") &
wait
python -m perf.sweep_merge "$WORK"/gate_{gsm,he_a,he_b,mt}.json --out "$R/width_gate_cpu.json" | tee "$R/width_gate_cpu.table.md"
