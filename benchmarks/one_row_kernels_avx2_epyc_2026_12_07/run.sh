#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct in fp32 with the shipped Clover heads, calibrated on first use with the third way
# (one row through the weights as they are): its default beside the same with every product packed, plain generate()
# and the packed peer (which follows the heads' choice), 10 MT-Bench questions (every 8th), one interleaved run.
set -eu
cd "$(dirname "$0")/../.."

B=benchmarks/one_row_kernels_avx2_epyc_2026_12_07
lscpu > $B/lscpu.txt
cerberus-hf bench --base qwen2.5-coder-1.5b-instruct --heads model_cards/clover-qwen2.5-coder-1.5b-instruct \
  --variants default packed --prompts cerberus_hf/data/mt_bench_questions.jsonl --every 8 --max-new-tokens 128 \
  --dtype float32 --no-prompt-lookup --json $B/qwen2.5-coder-1.5b-instruct_mt_bench_float32.json \
  --plot $B/qwen2.5-coder-1.5b-instruct_mt_bench_float32.png --resume > $B/qwen2.5-coder-1.5b-instruct_mt_bench_float32.md
