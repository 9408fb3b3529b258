#!/usr/bin/env bash
# The prepared GPU run: what is owed on CUDA that needs nothing but the checkout (scripts/device_slim.sh enter first,
# so the checkout fits a device call; carry .whl with a transformers wheel in the supported range, since the device
# machine has 5.17). Results go to $OUT. At most about 9 minutes: each step has its own time limit.
#
#   echo /.whl/ >> .git/info/exclude   # once; then the wheel (the machine has huggingface_hub, tokenizers, safetensors):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .whl transformers==5.24.0
#   device run, carry [".whl"], timeout 600:  bash scripts/gpu_run.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >> "$OUT/gpu.txt"
# 1. CUDA syncs per step of one call on a tiny base (seconds): 19 a step on 2026-11-27, 17 of them host copies since
#    sent through pinned memory; the CPU counter (tests/test_host_syncs.py) now sees 1 a step plus about 16 a call
for family in hydra eagle3 cerberus; do
  timeout 40 python3 scripts/count_host_syncs.py --tiny llama --head-type "$family" --max-new-tokens 48 \
    --json "$OUT/syncs_tiny_$family.json" >> "$OUT/syncs_tiny.txt" 2>&1
done
# 2. the 8B-shaped base at batch 1 (4 prompts), fp32 (in bf16 the random base's greedy path split between shapes of
#    the same forward, so the oracle lost track: 2026-11-27): oracle drafts, then drafts matched to the shipped Hydra's
#    per-depth acceptance on MT-Bench, in one process, each method warmed up at its timed shapes (the loop's compiled
#    static cache took 142 s to compile cold, a graph per bucket met; it now pads the steps max_length cuts short up to
#    the call's widest bucket); speedup against plain and the compiled static-cache peer
timeout 360 python3 scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype float32 --prompts 4 \
  --batch-sizes 1 --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json \
  --json "$OUT/scale_8b.json" > "$OUT/scale_8b.md" 2>&1
# 3. the 1B-shaped base, oracle drafts, with the time left
timeout 100 python3 scripts/gpu_scale_bench.py --shape llama-3.2-1b --device cuda --dtype float32 --prompts 4 \
  --batch-sizes 1 --drafts oracle --json "$OUT/scale_1b.json" > "$OUT/scale_1b.md" 2>&1
tail -n 14 "$OUT"/*.md; grep -v "^ " "$OUT"/syncs_tiny.txt
