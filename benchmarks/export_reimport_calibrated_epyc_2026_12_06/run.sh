#!/usr/bin/env bash
# Reproduces: the shipped Medusa and EAGLE-3 heads against their exports loaded back (issue 74, "Imported drafters get
#   fitted settings"): each export as it loads (the config's settings only) and after `cerberus-hf calibrate --write`
#   without --data (the base answers 40 packaged prompts and the folder is fitted to them), in one interleaved bench.
# Run: from the repository root, nothing else running:
#   bash benchmarks/export_reimport_calibrated_epyc_2026_12_06/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/export_reimport_calibrated_epyc_2026_12_06
TMP=$(mktemp -d)
export HF_HOME=$TMP/hf  # nothing fitted to this machine before the run
lscpu > "$OUT/lscpu.txt"
cerberus-hf export --format vllm-medusa model_cards/medusa-smollm2-135m-instruct "$TMP/medusa-export"
cerberus-hf export --format speculators model_cards/eagle3-smollm2-135m-instruct "$TMP/eagle3-export"
# each export loaded back as a user loads a drafter from another layout (on the packaged base: the export names the
# Hub id of its verifier, which this machine cannot reach), saved as this library's folder
python - "$TMP" <<'PY'
import shutil, sys
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model
tmp = sys.argv[1]
base = load_packaged_model()[0]
for family in ("medusa", "eagle3"):
    loaded = CerberusForCausalLM.from_pretrained(f"{tmp}/{family}-export", base_model=base)
    loaded.save_pretrained(f"{tmp}/{family}-export-as-loaded")
    shutil.copytree(f"{tmp}/{family}-export-as-loaded", f"{tmp}/{family}-export-calibrated")
PY
for family in medusa eagle3; do
  cerberus-hf calibrate --heads "$TMP/$family-export-calibrated" --limit 40 --write \
    --report "$OUT/calibration_$family.json" | tee "$OUT/calibration_$family.md"
done
HEADS=$(for family in medusa eagle3; do
  echo --heads model_cards/$family-smollm2-135m-instruct --heads "$TMP/$family-export-as-loaded" \
    --heads "$TMP/$family-export-calibrated"; done)
cerberus-hf bench $HEADS --every 4 --max-new-tokens 128 --no-prompt-lookup --variants default \
  --json "$OUT/fp32.json" --plot "$OUT/fp32.png" > "$OUT/fp32.md"
