"""Where a cached fp32 forward over n tokens spends its time beyond a forward over one (packed weights, SmolLM2)."""
import torch
from torch.profiler import profile, ProfilerActivity
from transformers import DynamicCache
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.blocks.packed import PackedWeights, packed_view

torch.set_num_threads(2)
base, _ = load_packaged_model(dtype=torch.float32)
packed = packed_view(base, PackedWeights())
g = torch.Generator().manual_seed(0)
cache = DynamicCache(config=base.config)
ctx = 300
with torch.no_grad():
    packed(input_ids=torch.randint(0, 49152, (1, ctx), generator=g), cache=cache, use_cache=True)

def run(n, reps):
    with torch.no_grad():
        for _ in range(reps):
            t = torch.randint(0, 49152, (1, n), generator=g)
            packed(input_ids=t, cache=cache, position_ids=torch.arange(ctx, ctx + n)[None], use_cache=True)
            cache.crop(-n)

for n in (1, 8):
    run(n, 5)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        run(n, 20)
    print(f"=== n={n}")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
