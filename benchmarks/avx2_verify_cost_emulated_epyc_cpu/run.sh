#!/usr/bin/env bash
# The cost of a forward over n tokens, where it goes, and the kernels' share: natively, then with torch's kernels capped to AVX2.
cd "$(dirname "$0")"
CAP="ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2"
for run in native capped; do
  prefix=""; [ $run = capped ] && prefix="env $CAP"
  $prefix python curve.py 2>/dev/null | tail -1 > curve_$run.json
  $prefix python kern.py 2>/dev/null > kernels_$run.txt
  $prefix python prof.py 2>/dev/null | grep -v -e Loading -e USDT > profile_$run.txt
  $prefix python gqa.py 2>/dev/null | grep context > gqa_$run.txt
done
# generate() with the grouped-attention view against the same calls copying keys per head (run from the repository root)
cd ../..
D=benchmarks/avx2_verify_cost_emulated_epyc_cpu
python $D/grouped_bench.py $D/grouped_native.json
python $D/grouped_bench.py $D/grouped_native_40.json 2
env $CAP TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_avx2 HF_HOME=/tmp/hf_emul3 python $D/grouped_bench.py $D/grouped_capped.json
