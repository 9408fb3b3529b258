"""Decode steps of 96 rows (distilling's batch) through the 1.5B's weights as they are and packed, interleaved."""
import statistics, time, torch
from transformers import DynamicCache
from cerberus_hf.blocks.packed import packed_model
from cerberus_hf.real_models import load_packaged_model, PACKAGED_MODELS
torch.set_num_threads(2)
base, _ = load_packaged_model(PACKAGED_MODELS["qwen2.5-coder-1.5b-instruct"], dtype=torch.float32)
packed = packed_model(base)
rows, context = 96, 64
g = torch.Generator().manual_seed(0)
with torch.inference_mode():
    cache = DynamicCache(config=base.config)
    s = time.perf_counter()
    packed(input_ids=torch.randint(0, 150000, (rows, context), generator=g), past_key_values=cache, use_cache=True, logits_to_keep=1)
    print(f"prefill {rows}x{context} packed: {time.perf_counter() - s:.1f} s", flush=True)
    times = {"as is": [], "packed": []}
    for rep in range(4):
        for name, model in (("as is", base), ("packed", packed)):
            ids = torch.randint(0, 150000, (rows, 1), generator=g)
            s = time.perf_counter()
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            times[name].append(time.perf_counter() - s)
            cache.crop(-1)
    for name, t in times.items():
        print(f"{name}: decode step of {rows} rows {statistics.median(t[1:]):.2f} s (all: {', '.join(f'{x:.2f}' for x in t)})")
