#!/usr/bin/env bash
cd /work/main
cerberus-hf bench --dtype float32 --prompts ../shared/bench/mt_bench.jsonl --max-new-tokens 128 --no-prompt-lookup \
  --heads /work/dflash/heads-calibrated --heads model_cards/eagle3-smollm2-135m-instruct --variants default \
  --json /work/dflash/b80/dflash_80.json --plot /work/dflash/b80/dflash_80.png "$@"
