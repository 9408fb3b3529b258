#!/usr/bin/env bash
# the real AVX2-only EPYC: Qwen2.5-Coder-1.5B, HumanEval every 32nd (6), fp32, heads calibrated on first use
set -eu
cd "$(dirname "$0")/../.."

R=benchmarks/qwen_coder_avx2_epyc_2026_12_06
mkdir -p $R
lscpu > $R/lscpu.txt
B=qwen2.5-coder-1.5b-instruct
cerberus-hf bench --base $B --heads model_cards/clover-$B --heads model_cards/hydra-$B --variants default \
  --prompts humaneval --every 32 --max-new-tokens 128 --dtype float32 --assistant qwen2.5-coder-0.5b-instruct \
  --assistant-tokens --json $R/${B}_humaneval_float32.json --plot $R/${B}_humaneval_float32.png --resume \
  > $R/${B}_humaneval_float32.md
