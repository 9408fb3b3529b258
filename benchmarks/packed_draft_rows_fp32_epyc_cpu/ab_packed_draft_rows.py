"""Interleaved: the shipped EAGLE-3 default with the draft rows packed (new) and through linear (before)."""
import torch, time
from cerberus_hf import CerberusForCausalLM, settings_selection as MC  # where decoding_view packs the draft rows
from cerberus_hf.real_models import load_named_model
from cerberus_hf.tools.bench import load_bench_prompts, encode_prompts
torch.set_num_threads(2)
_, tok = load_named_model("smollm2-135m-instruct")
prompts = encode_prompts(tok, load_bench_prompts("../shared/bench/mt_bench.jsonl", every=4))
model = CerberusForCausalLM.from_pretrained("model_cards/eagle3-smollm2-135m-instruct").to(torch.float32).eval()
refs = [model.base.generate(ids, max_new_tokens=128, do_sample=False) for ids in prompts]
real_view = MC.module_view
def off(module, children=None, **attributes):
    attributes.pop("linear", None)
    return real_view(module, children, **attributes)
res = {"packed rows": [0, 0.0, 0], "rows through linear": [0, 0.0, 0]}
model.generate(prompts[0], max_new_tokens=16)
for i, (ids, ref) in enumerate(zip(prompts, refs)):
    order = ["packed rows", "rows through linear"] if i % 2 == 0 else ["rows through linear", "packed rows"]
    for name in order:
        MC.module_view = real_view if name == "packed rows" else off
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=128)
        dt = time.perf_counter() - t
        r = res[name]; r[0] += model.generation_stats.new_tokens; r[1] += dt; r[2] += torch.equal(out, ref)
MC.module_view = real_view
for name, (n, s, same) in res.items():
    print(f"| {name} | {n / s:.1f} tokens/s | {same}/{len(prompts)} identical |")
print("ratio", (res["packed rows"][0] / res["packed rows"][1]) / (res["rows through linear"][0] / res["rows through linear"][1]))
