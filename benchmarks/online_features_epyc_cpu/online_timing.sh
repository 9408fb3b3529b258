#!/usr/bin/env bash
# Cost of --features online against the cache: EAGLE-3 (3 depths) on 200 SmolLM2 records, 30 steps, alone.
# Run from the repository root; WORK (default /tmp/online-features) holds the runs.
set -e
DATA=$PWD/data/smollm2_selfdistill.jsonl
WORK=${WORK:-/tmp/online-features}
mkdir -p "$WORK" && cd "$WORK" && rm -rf ot && mkdir ot
head -200 "$DATA" > ot/online200.jsonl
COMMON="--base smollm2-135m-instruct --head-type eagle3 --num-heads 3 --data ot/online200.jsonl --max-steps 30 \
  --batch-tokens 2048 --num-threads 2 --eval-every 1000 --no-progress"
/usr/bin/time -f "cached: %e s wall, %M KB max RSS" cerberus-hf train $COMMON --cache-dir ot/cache --output ot/cached 2>&1 | grep -v INFO | tail -3
du -sb ot/cache
/usr/bin/time -f "online: %e s wall, %M KB max RSS" cerberus-hf train $COMMON --features online --cache-dir ot/online-cache --output ot/online 2>&1 | grep -v INFO | tail -3
ls ot/online-cache 2>/dev/null || echo "online cache dir: absent"
python - <<'PY'
import json
for run in ("cached", "online"):
    c = json.load(open(f"ot/{run}/training_metrics.json"))["cost"]
    print(run, {k: c[k] for k in ("cache_time_s", "train_time_s", "eval_time_s", "wall_time_s")},
          "s/step", round(c["train_time_s"] / 30, 2))
PY
