#!/usr/bin/env bash
# bf16 on an AVX2-only EPYC (no bf16 kernels): every shipped SmolLM2 family in its first-use default, before and after
# the fit's 10% gain margin. BEFORE=/path/to/a/checkout/of/the/commit/before runs the "before" row from it.
set -eu
cd "$(dirname "$0")/../.."
D=benchmarks/defaults_bf16_margin_avx2_epyc_2026_12_07
lscpu > $D/lscpu.txt
H=""
for f in hydra clover eagle3 medusa cerberus kangaroo; do H="$H --heads model_cards/$f-smollm2-135m-instruct"; done
run() {  # name, then the python whose cerberus_hf runs
  "${@:2}" -m cerberus_hf.tools.cli bench $H --prompts ../shared/bench/mt_bench.jsonl --every 8 --max-new-tokens 128 \
    --dtype bfloat16 --no-prompt-lookup --variants default --json $D/$1.json --plot $D/$1.png > $D/$1.md
}
if [ -n "${BEFORE:-}" ]; then run before env PYTHONPATH="$BEFORE" python -P; fi
run after python
