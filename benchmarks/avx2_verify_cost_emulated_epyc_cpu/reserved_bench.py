"""generate() with the loop's dynamic cache growing in place (`blocks.reserved_cache`) against the same calls with
transformers' DynamicLayer (a torch.cat of the whole cache a step; the swap switched off in this process only), SmolLM2
fp32 with the shipped EAGLE-3 and Hydra folders, greedy, one interleaved run (`bench.run_methods`: every row warmed
up, the order rotating) beside plain generate() and the packed plain peer. Prompts: ``short``, every 8th MT-Bench
question; ``long``, six prompts of about 1,500 tokens (four consecutive answers of data/sharegpt_selfdistill.jsonl
from line 9,001 on, then a question about them), 128 new tokens each."""
import json
import sys
from contextlib import contextmanager

import torch

import cerberus_hf.decoding.static_cache as static_cache
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.packed import PackedWeights, packed_view
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.tools.bench import Method, encode_prompts, load_bench_prompts, markdown_table, run_methods

torch.set_num_threads(2)
kind, output = sys.argv[1], sys.argv[2]


@contextmanager
def concatenating_cache():
    """The loop keeps generate()'s dynamic cache as transformers makes it, as before `reserve_room`."""
    with_room = static_cache.with_room
    static_cache.with_room = lambda model, cache: cache
    try:
        yield
    finally:
        static_cache.with_room = with_room


def concatenating(run):
    def wrapped(inputs):
        with concatenating_cache():
            return run(inputs)
    return wrapped


def long_prompts(tokenizer, count: int = 6, answers: int = 4) -> list[str]:
    with open("data/sharegpt_selfdistill.jsonl") as handle:
        records = [json.loads(line) for line in list(handle)[9000: 9000 + count * answers]]
    texts = [tokenizer.decode(r["output_ids"], skip_special_tokens=True) for r in records]
    return ["\n\n".join(texts[i * answers: (i + 1) * answers])
            + "\n\nWhich of the texts above is the most useful, and why?" for i in range(count)]


base, tokenizer = load_packaged_model(dtype=torch.float32)
packed = packed_view(base, PackedWeights())
call = dict(max_new_tokens=128, do_sample=False)
methods = [Method("plain generate()", lambda x: (base.generate(x, **call), None)),
           Method("plain generate(), packed weights", lambda x: (packed.generate(x, **call), None))]
for family in ("eagle3", "hydra"):
    model = CerberusForCausalLM.from_pretrained(f"model_cards/{family}-smollm2-135m-instruct", base_model=base)
    run = lambda x, model=model: (model.generate(x, **call), model.generation_stats)
    methods += [Method(f"{family} default, cache grown in place", run),
                Method(f"{family} default, cache concatenated a step", concatenating(run))]
prompts = load_bench_prompts("../shared/bench/mt_bench.jsonl", every=8) if kind == "short" else long_prompts(tokenizer)
encoded = encode_prompts(tokenizer, prompts)
print("prompt tokens:", [x.shape[1] for x in encoded])
result = run_methods(methods, encoded, base.device, warmup=1, eos={base.generation_config.eos_token_id})
print(markdown_table(result))
json.dump(result, open(output, "w"), indent=1)
