#!/usr/bin/env bash
# Reproduces: the borrowed-against-measured calibration entries of every shipped family on the processor at hand
#   (issue 72, "Calibration a user can trust"): each folder's stored entry (fitted on another processor of this
#   instruction class, what `generate(calibrate=False)` decodes with) beside the entry first use fits to this
#   processor from the folder's calibration positions (FIRST_USE_PLAN, the 30-second plan), in one interleaved bench.
# Run: from the repository root, nothing else running: bash benchmarks/calibration_borrowed_vs_measured_epyc_2026_12_06/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=benchmarks/calibration_borrowed_vs_measured_epyc_2026_12_06
export HF_HOME=$(mktemp -d)  # a fresh cache: nothing fitted to this machine before the run
FAMILIES="hydra clover eagle3 medusa cerberus kangaroo"
HEADS=$(for family in $FAMILIES; do echo --heads model_cards/$family-smollm2-135m-instruct; done)
lscpu > "$OUT/lscpu.txt"
# first use's measurement for each folder, into the fresh cache (what a first generate() here would do)
python - $FAMILIES <<'PY' | tee "$OUT/first_use.md"
import sys
import torch
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.calibration.first_use import FIRST_USE_PLAN, calibrate_machine
from cerberus_hf.real_models import load_packaged_model

torch.set_num_threads(2)
base, _ = load_packaged_model()
print("| family | stored entry it borrows | first use here: seconds | tree kind | gate |")
print("|---|---|---|---|---|")
for family in sys.argv[1:]:
    model = CerberusForCausalLM.from_pretrained(f"model_cards/{family}-smollm2-135m-instruct", base_model=base)
    borrowed = model.decoding_settings(calibrate=False)["calibration"]
    fitted, _, seconds = calibrate_machine(model, FIRST_USE_PLAN)
    print(f"| {family} | {borrowed} | {seconds:.1f} | {fitted.settings['tree_kind']} | "
          f"{fitted.settings['gate_signal']} < {fitted.settings['gate_threshold']} |")
PY
cerberus-hf bench $HEADS --every 8 --max-new-tokens 128 --no-prompt-lookup --variants default stored \
  --json "$OUT/fp32.json" --plot "$OUT/fp32.png" > "$OUT/fp32.md"
