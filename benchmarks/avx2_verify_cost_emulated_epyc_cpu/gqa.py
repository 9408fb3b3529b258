"""A cached forward over n tokens with sdpa's enable_gqa under a mask (TRANSFORMERS_SDPA_FORCE_GQA) against transformers'
default (repeat_kv copies the keys and values to every query head): identical logits? time?"""
import os, time, statistics, torch
from transformers import DynamicCache
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.blocks.packed import PackedWeights, packed_view
torch.set_num_threads(2)
base, _ = load_packaged_model(dtype=torch.float32)
packed = packed_view(base, PackedWeights())
for ctx in (300, 1000):
    cache = DynamicCache(config=base.config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        packed(input_ids=torch.randint(0, 49152, (1, ctx), generator=g), cache=cache, use_cache=True)
    def fwd(n, tokens):
        out = packed(input_ids=tokens, cache=cache, position_ids=torch.arange(ctx, ctx + n)[None], use_cache=True).logits
        cache.crop(-n); return out
    for n in (1, 8):
        tokens = torch.randint(0, 49152, (1, n), generator=g)
        times = {"0": [], "1": []}
        outs = {}
        with torch.no_grad():
            for rep in range(12):
                for flag in ("0", "1"):
                    os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = flag
                    t = time.perf_counter(); outs[flag] = fwd(n, tokens); times[flag].append(time.perf_counter() - t)
        print(f"context {ctx} n={n}: repeat_kv {statistics.median(times['0'][2:])*1e3:.2f} ms, enable_gqa {statistics.median(times['1'][2:])*1e3:.2f} ms, identical {torch.equal(outs['0'], outs['1'])}", flush=True)
