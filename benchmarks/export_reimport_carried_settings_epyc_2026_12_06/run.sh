#!/usr/bin/env bash
# Reproduces: the shipped Medusa and EAGLE-3 heads against their exports loaded back (issue 74, "Imported drafters get
#   fitted settings"), with the exports carrying what only this library reads (the config's decoding settings under
#   `cerberus_hf` in config.json; the n-gram rescorer, calibration positions and entries in cerberus_hf/): each export
#   as it loads and after `cerberus-hf calibrate --write` without --data (the base answers 40 packaged prompts and the
#   folder is fitted to them). The protocol of export_reimport_calibrated_epyc_2026_12_06, with its one bench split in
#   three: the shipped folders (with and without what the exports did not carry before), then each family's exports.
#   tau does not depend on which rows share a bench; speeds compare within one report only.
# Run: from the repository root, nothing else running:
#   bash benchmarks/export_reimport_carried_settings_epyc_2026_12_06/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/export_reimport_carried_settings_epyc_2026_12_06
TMP=$(mktemp -d)
export HF_HOME=$TMP/hf  # nothing fitted to this machine before the run
lscpu > "$OUT/lscpu.txt"
# 1. The shipped folders, each in its default and without its copied prompt tokens (variant default-lookup), and
#    Medusa's without its n-gram rescorer (a copy without ngram.safetensors)
cp -rL model_cards/medusa-smollm2-135m-instruct "$TMP/medusa-nongram"
rm "$TMP/medusa-nongram/ngram.safetensors"
cerberus-hf bench --heads model_cards/medusa-smollm2-135m-instruct --heads "$TMP/medusa-nongram" \
  --heads model_cards/eagle3-smollm2-135m-instruct --every 4 --max-new-tokens 128 --no-prompt-lookup --no-packed-peer \
  --variants default default-lookup --json "$OUT/shipped_without_lookup_or_ngram.json" \
  > "$OUT/shipped_without_lookup_or_ngram.md"
# 2. The exports
cerberus-hf export --format vllm-medusa model_cards/medusa-smollm2-135m-instruct "$TMP/medusa-export"
cerberus-hf export --format speculators model_cards/eagle3-smollm2-135m-instruct "$TMP/eagle3-export"
(cd "$TMP" && find medusa-export eagle3-export -type f | sort) > "$OUT/exported_files.txt"
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
# 3. Each family's export calibrated without data, then as loaded and calibrated in a bench (on the day the two
#    calibrations ran at the same time, and the two benches too: the cores were shared)
for family in medusa eagle3; do
  cerberus-hf calibrate --heads "$TMP/$family-export-calibrated" --limit 40 --write \
    --report "$OUT/calibration_$family.json" | tee "$OUT/calibration_$family.md"
  cerberus-hf bench --heads "$TMP/$family-export-as-loaded" --heads "$TMP/$family-export-calibrated" \
    --every 4 --max-new-tokens 128 --no-prompt-lookup --no-packed-peer --variants default \
    --json "$OUT/fp32_$family.json" > "$OUT/fp32_$family.md"
done
