"""Relative cost of a cached fp32 forward over n new tokens (n = 1..16) of SmolLM2, plain and through packed weights,
as `calibrate` measures it; run natively and with torch's kernels capped to AVX2 to compare with the AVX2-only EPYC."""
import json, os
import torch
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.blocks.packed import PackedWeights, packed_view
from cerberus_hf.calibration.measure import measure_cost_curves
from cerberus_hf.hardware import instruction_class

torch.set_num_threads(2)
base, _ = load_packaged_model(dtype=torch.float32)
base.eval()
packed = packed_view(base, PackedWeights())
curves = measure_cost_curves([base, packed], max_tokens=16, repeats=7)
row = {"isa": instruction_class(torch.device("cpu")), "env": {k: os.environ.get(k) for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}}
for name, curve in zip(("plain", "packed"), curves):
    row[name] = {"single_ms": round(curve[1] * 1e3, 2), **{n: round(curve[n] / curve[1], 3) for n in (2, 4, 8, 16)}}
print(json.dumps(row))
