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
# 1. the 8B-shaped base at batch 1 (4 prompts): oracle drafts, then drafts matched to the shipped Hydra's per-depth
#    acceptance on MT-Bench, in one process (the base and the compiled graphs built once), each warmed up at its timed
#    shapes; speedup against plain and the compiled static-cache peer, host reads and CUDA syncs per step. On
#    2026-11-27 two runs that built the base twice and warmed up at other shapes printed no row in 150 s and 110 s.
timeout 330 python3 scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --prompts 4 \
  --batch-sizes 1 --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json \
  --json "$OUT/scale_8b.json" > "$OUT/scale_8b.md" 2>&1
# 2. CUDA syncs per step of one call on a tiny base, for the families whose read counts differ (docs/cuda.md)
for family in hydra eagle3 cerberus; do
  timeout 40 python3 scripts/count_host_syncs.py --tiny llama --head-type "$family" --max-new-tokens 48 \
    --json "$OUT/syncs_tiny_$family.json" >> "$OUT/syncs_tiny.txt" 2>&1
done
# 3. the 1B-shaped base, the same way, with the time left
timeout 120 python3 scripts/gpu_scale_bench.py --shape llama-3.2-1b --device cuda --dtype bfloat16 --prompts 4 \
  --batch-sizes 1 --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json \
  --json "$OUT/scale_1b.json" > "$OUT/scale_1b.md" 2>&1
tail -n 14 "$OUT"/*.md; tail -n 5 "$OUT"/syncs_tiny.txt
