#!/usr/bin/env bash
# Reproduces the shipped SmolLM2-135M-Instruct heads under model_cards/: data, training, cards.
# Every step is resumable: run it again after an interruption and it continues where it stopped.
#   bash scripts/train_shipped_heads.sh            # all steps
#   STEPS="train card" bash scripts/train_shipped_heads.sh
#   OUT=/tmp/repro TYPES=cerberus STEPS=train bash scripts/train_shipped_heads.sh   # check a shipped checkpoint
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-data/smollm2_selfdistill.jsonl}
PROMPTS_EVAL=${PROMPTS_EVAL:-../shared/bench/mt_bench.jsonl}
STEPS=${STEPS:-"distill cache train card"}
EPOCHS=${EPOCHS:-2}
OUT=${OUT:-model_cards}   # set OUT=elsewhere to reproduce the shipped heads without overwriting them
TYPES=${TYPES:-"medusa cerberus"}   # head types to train / describe

for step in $STEPS; do
  case $step in
    distill)  # the base model's own answers to cerberus_hf/data/prompts.jsonl (a complete file is a no-op)
      cerberus-hf distill --output "$DATA" --batch-size 64 --max-new-tokens 128 \
        --sample-fraction 0.25 --seed 0 --threads 1 ;;
    cache)    # the base's last hidden states over the data, shared by both head types
      cerberus-hf train --cache-only --data "$DATA" --teacher-topk 0 ;;
    train)
      for type in $TYPES; do
        cerberus-hf train --head-type "$type" --num-heads 4 --num-layers 1 --data "$DATA" \
          --output "$OUT/$type-smollm2-135m-instruct" --epochs "$EPOCHS" --batch-size 256 --lr 1e-3 \
          --warmup-ratio 0.05 --head-weight-decay 0.8 --distill-weight 0 --teacher-topk 0 \
          --projection-dtype bfloat16 --eval-every 200 --seed 0
      done ;;
    card)     # tau on MT-Bench (evaluation only; never trained on) and the model cards
      for type in $TYPES; do
        cerberus-hf card --heads "$OUT/$type-smollm2-135m-instruct" \
          --prompts "$PROMPTS_EVAL" --max-new-tokens 128
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
