#!/usr/bin/env bash
# The prepared GPU run: what is owed on CUDA that needs nothing but the checkout (scripts/device_slim.sh enter first,
# so the checkout fits a device call; carry .whl with a transformers wheel in the supported range, since the device
# machine has 5.17). Results go to $OUT (at most 8 files come back). At most about 9 minutes: each step has its own
# time limit.
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
# 1. the 8B-shaped base at batch 1 (4 prompts), oracle drafts then drafts matched to the shipped Hydra's per-depth
#    acceptance on MT-Bench: speedup against plain and the compiled static-cache peer. First, because on 2026-11-27
#    the same bench at 16 prompts and batch 1/4/16 printed no row within 150 s (one H200); stderr shows each phase.
timeout 200 python3 scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --prompts 4 \
  --batch-sizes 1 --json "$OUT/scale_8b_oracle.json" > "$OUT/scale_8b_oracle.md" 2>&1
timeout 160 python3 scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --prompts 4 \
  --batch-sizes 1 --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json \
  --json "$OUT/scale_8b_matched.json" > "$OUT/scale_8b_matched.md" 2>&1
# 2. the static cache on CUDA, where generate() compiles its forward with CUDA graphs (passed 13/13 on 2026-11-27)
CERBERUS_TEST_DEVICE=cuda timeout 80 python3 -m pytest -p no:cacheprovider -q -m "not real_model and not slow" \
  tests/test_static_cache.py -k "(greedy_output_equals_base and hydra and not prefix and (llama or gpt2)) \
  or compiled_forward_is_exact or (partly_accepted and llama) or fed_a_bucket" > "$OUT/pytest_cuda_static.txt" 2>&1
# 3. exactness of the batched and single loops on the GPU, fp32, with what time is left (204 passed, none failed,
#    in the 120 s of 2026-11-27)
CERBERUS_TEST_DEVICE=cuda timeout 90 python3 -m pytest -p no:cacheprovider -q -m "not real_model and not slow" \
  tests/test_batched.py tests/test_exactness.py > "$OUT/pytest_cuda.txt" 2>&1
tail -n 3 "$OUT"/*.md "$OUT"/*.txt
