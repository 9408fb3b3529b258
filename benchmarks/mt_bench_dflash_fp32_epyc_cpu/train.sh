#!/usr/bin/env bash
# DFlash drafter for SmolLM2-135M-Instruct: 5 depths (a block of 6), one layer over the fused states entering
# layers 2, 15 and 27 (EAGLE-3's), bf16 base states and bf16 autocast, the 4,096 most frequent answer tokens.
cd /work/dflash
MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0 cerberus-hf train --head-type dflash --num-heads 5 \
  --data /work/main/data/smollm2_selfdistill.jsonl --data /work/dflash/sharegpt_3000.jsonl --output heads --init-from heads420 \
  --feature-layers 2 15 27 --max-steps 1800 --lr 1e-3 --batch-tokens 1024 --train-vocab 4096 --num-threads 2 \
  --dtype bfloat16 --compute-dtype bfloat16 --eval-every 5000 --seed 1 --save-every 50 "$@"
