# Reproduces: the README's ceiling, "with perfect drafts the loop would reach 2.91x (4 heads)" on the 2-core AMD EPYC
#   in fp32 (3.72x with 7; docs/benchmarks.md, "The oracle ceiling"; benchmarks/oracle_ceiling_cpu/).
# Run: python scripts/oracle_ceiling.py 5      (the first 5 MT-Bench prompts: bench's default, the packaged questions)
"""The ceiling of the draft-verify loop on this machine: the heads are replaced by an oracle that drafts the
base's own greedy continuation (`cerberus_hf.testing.install_oracle`), so every draft is accepted, while the loop,
the verification forward and the (full-vocabulary) head projection are the real ones.

    python scripts/oracle_ceiling.py 5      # the first 5 MT-Bench prompts, 128 new tokens

Prints speedup over plain generate() (interleaved per prompt), tau and milliseconds per step by phase,
for a chain of 4 and of 7 oracle heads. It says what better heads could buy here, not what ours do.
"""
import sys
import time

import torch
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.testing import install_oracle
from cerberus_hf.tools.bench import DEFAULT_PROMPTS, encode_prompts, load_bench_prompts

base, tok = load_packaged_model()
prompts = encode_prompts(tok, load_bench_prompts(str(DEFAULT_PROMPTS), int(sys.argv[1])))
N = 128
rows = []
for heads in (4, 7):
    plain_t = plain_n = fast_t = fast_n = steps = 0
    phases = {}
    for ids in prompts:
        ref = base.generate(ids, max_new_tokens=N + heads + 2, do_sample=False)
        model = CerberusForCausalLM.from_base(base, head_type="cerberus", num_heads=heads, gate_threshold=None)
        install_oracle(model, [ref])
        model.generate(ids, max_new_tokens=8)  # warm
        t = time.perf_counter(); a = base.generate(ids, max_new_tokens=N, do_sample=False); plain_t += time.perf_counter() - t
        t = time.perf_counter(); b = model.generate(ids, max_new_tokens=N, profile=True); fast_t += time.perf_counter() - t
        assert torch.equal(a, b)
        plain_n += a.shape[1] - ids.shape[1]; fast_n += b.shape[1] - ids.shape[1]; steps += model.generation_stats.steps
        for k, v in model.generation_stats.phase_seconds.items():
            phases[k] = phases.get(k, 0) + v
    rows.append((heads, plain_n / plain_t, fast_n / fast_t, (fast_n / fast_t) / (plain_n / plain_t), fast_n / steps,
                 {k: round(1000 * v / steps, 1) for k, v in phases.items()}))
print("| oracle chain of heads | plain tok/s | oracle tok/s | speedup | tau | ms per step by phase |")
print("|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]:.1f} | {r[2]:.1f} | {r[3]:.2f}x | {r[4]:.2f} | {r[5]} |")
