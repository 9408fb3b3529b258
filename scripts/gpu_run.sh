#!/usr/bin/env bash
# Reproduces: the CUDA runs of docs/cuda.md, "The prepared GPU run" (its versions made Call 1 of each
#   benchmarks/cuda_h200_*/ run; this one: the device-step tests on CUDA, the 8B-shaped bf16 scale bench at batch 1, 4
#   and 16, and syncs per step, scripts/gpu_scale_bench.py and scripts/count_host_syncs.py).
# Run: a device call with carry [".whl"] and timeout 600: bash scripts/gpu_run.sh (setup below).
#
# The prepared GPU run: what is owed on CUDA that needs nothing but the checkout (scripts/device_slim.sh enter first,
# so the checkout fits a device call; carry .whl with a transformers wheel in the supported range, since the device
# machine has 5.17). Results go to $OUT. At most about 9 minutes: each step has its own time limit. Its rows are the open CUDA issue's.
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
# 1. the device step on CUDA (decoding.device_step, compiled into CUDA graphs): the graph path against plain greedy
#    generate() token for token on the tiny llama, each family, batch 1 and 4, oracle drafts (and a base's own MTP
#    layers on the tiny DeepSeek-V3 and GLM-4.5); its fullgraph compile and host reads (-v: a run cut short still says
#    what passed)
CERBERUS_TEST_DEVICE=cuda timeout 200 python3 -m pytest -v -p no:cacheprovider -m "not slow" tests/test_device_step.py \
  -k "(equals_plain and (llama or mtp) and oracle) or compiles_whole and llama or reads_nothing or other_lengths" \
  > "$OUT/pytest_device_step_cuda.txt" 2>&1
# 2. the 8B-shaped base in bf16 with drafts matched to the shipped Hydra's per-depth acceptance, at batch 1, 4 and 16:
#    plain generate(), the compiled static-cache peer, the loop, and the device step; syncs per step counted by the GPU
timeout 300 python3 scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --robust \
  --prompts 16 --batch-sizes 1 4 16 --drafts matched \
  --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json \
  --json "$OUT/scale_8b_bf16.json" > "$OUT/scale_8b_bf16.md" 2> "$OUT/scale_8b_bf16.log"
# 3. syncs per step of one call on a tiny base, loop and device step
timeout 40 python3 scripts/count_host_syncs.py --tiny llama --head-type hydra --max-new-tokens 48 \
  --json "$OUT/syncs_tiny_hydra.json" > "$OUT/syncs_tiny.txt" 2>&1
grep "^|" "$OUT"/scale_8b_bf16.md; echo "device-step CUDA tests: $(grep -c " PASSED" "$OUT"/pytest_device_step_cuda.txt) passed"
grep " FAILED" "$OUT"/pytest_device_step_cuda.txt; grep -v "^ " "$OUT"/syncs_tiny.txt
