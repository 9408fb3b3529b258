#!/usr/bin/env bash
# An AVX2-only EPYC (family 25, AVX-512 not exposed): Qwen2.5-Coder-1.5B, HumanEval every 8th problem (21), fp32, the
# shipped heads calibrated on first use (with the one-row way), against plain generate(), the plain packed peer and
# transformers' assisted generation with the 0.5B sibling (its defaults), one interleaved run
set -eu
cd "$(dirname "$0")/../.."

R=benchmarks/qwen_coder_humaneval_avx2_epyc_2026_12_07
lscpu > $R/lscpu.txt
B=qwen2.5-coder-1.5b-instruct
cerberus-hf bench --base $B --heads model_cards/clover-$B --heads model_cards/hydra-$B --variants default \
  --prompts humaneval --every 8 --max-new-tokens 128 --dtype float32 --no-prompt-lookup \
  --assistant qwen2.5-coder-0.5b-instruct --assistant-tokens --json $R/${B}_humaneval_float32.json \
  --plot $R/${B}_humaneval_float32.png --resume > $R/${B}_humaneval_float32.md
