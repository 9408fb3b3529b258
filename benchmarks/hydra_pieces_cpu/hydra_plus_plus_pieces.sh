#!/usr/bin/env bash
# Which of Hydra++'s pieces pay for themselves (issue 10), as measured on 2026-11-23 (docs/families.md, "Hydra and Hydra++"):
#   prefix  the prefix layer at the shipped Hydra's full budget (2 epochs), its calibration, and a 20-prompt bench
#           beside the shipped Hydra heads;
#   pieces  250-step runs of the same recipe and seed: plain Hydra, the teacher loss, head dropout, and the prefix
#           layer with a window of 1 and of 32 (each one piece against the plain run).
#   OUT=/tmp/hydrapp STEPS="prefix pieces" bash benchmarks/hydra_pieces_cpu/hydra_plus_plus_pieces.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/hydrapp}
DATA=${DATA:-data/smollm2_selfdistill.jsonl}
STEPS=${STEPS:-"prefix pieces"}
RECIPE="--head-type hydra --num-heads 4 --num-layers 1 --data $DATA --batch-size 256 --lr 1e-3 --warmup-ratio 0.05
  --head-weight-decay 0.8 --projection-dtype float32 --seed 0"
PREFIX="--prefix-layer --adapter-heads 9 --adapter-head-dim 64"   # the base's attention shape (SmolLM2-135M: 9 x 64)
for step in $STEPS; do
  case $step in
    prefix)
      cerberus-hf train $RECIPE $PREFIX --context-window 32 --epochs 2 --eval-every 200 --distill-weight 0 \
        --teacher-topk 0 --output "$OUT/hydra-prefix"
      cerberus-hf calibrate --heads "$OUT/hydra-prefix" --data "$DATA" --draft-vocab 4096 --limit 200 \
        --report "$OUT/hydra-prefix/calibration_cpu.json" --write
      cerberus-hf bench --heads model_cards/hydra-smollm2-135m-instruct --heads "$OUT/hydra-prefix" \
        --prompts ../shared/bench/mt_bench.jsonl --every 4 --max-new-tokens 128 --variants tree dtree dtree+gate+lookup \
        --profile --json "$OUT/bench.json" --plot "$OUT/bench.png" ;;
    pieces)
      cerberus-hf train --cache-only --data "$DATA" --teacher-topk 32   # the teacher's top-32, for --distill-weight
      short="$RECIPE --max-steps 250 --eval-every 1000 --no-progress"
      cerberus-hf train $short --output "$OUT/abl-base" --distill-weight 0 --teacher-topk 0
      cerberus-hf train $short --output "$OUT/abl-teacher" --distill-weight 1 --teacher-topk 32
      cerberus-hf train $short --output "$OUT/abl-dropout" --distill-weight 0 --teacher-topk 0 --head-dropout 0.2
      cerberus-hf train $short --output "$OUT/abl-prefix-w1" --distill-weight 0 --teacher-topk 0 $PREFIX --context-window 1
      cerberus-hf train $short --output "$OUT/abl-prefix" --distill-weight 0 --teacher-topk 0 $PREFIX --context-window 32 ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
