#!/usr/bin/env bash
# An AVX2-only EPYC (family 25, AVX-512 not exposed): Qwen2.5-Coder-1.5B, MT-Bench every 8th question (10), fp32,
# the shipped heads calibrated on first use, against the users' drafters (the assistant in its defaults)
set -eu
cd "$(dirname "$0")/../.."

R=benchmarks/qwen_coder_mt_bench_avx2_epyc_2026_12_07
lscpu > $R/lscpu.txt
B=qwen2.5-coder-1.5b-instruct
cerberus-hf bench --base $B --heads model_cards/clover-$B --heads model_cards/hydra-$B --variants default \
  --prompts cerberus_hf/data/mt_bench_questions.jsonl --every 8 --max-new-tokens 128 --dtype float32 \
  --assistant qwen2.5-coder-0.5b-instruct --assistant-tokens --json $R/${B}_mt_bench_float32.json \
  --plot $R/${B}_mt_bench_float32.png --resume > $R/${B}_mt_bench_float32.md
