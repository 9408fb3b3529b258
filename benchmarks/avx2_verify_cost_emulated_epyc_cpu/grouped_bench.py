"""generate() with the grouped-query attention view (`blocks.grouped_attention`) against the same call with
transformers' sdpa copying the cache per query head (the view switched off in this process only), SmolLM2 fp32 with
the shipped EAGLE-3 and Hydra folders, 128 new tokens, every 8th MT-Bench question (or every Nth: argument 2), one interleaved run
(`bench.run_methods`: every row warmed up, the order rotating) beside plain generate() and the packed plain peer."""
import json
import sys
from contextlib import contextmanager

import torch

import cerberus_hf.settings_selection as modeling  # where decoding_view takes the grouped attention view
from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.packed import PackedWeights, packed_view
from cerberus_hf.real_models import load_packaged_model
from cerberus_hf.tools.bench import Method, encode_prompts, load_bench_prompts, markdown_table, run_methods

torch.set_num_threads(2)


@contextmanager
def copying_attention():
    """Decoding views keep transformers' sdpa (`repeat_kv` under a mask), as before the grouped view."""
    grouped = modeling.grouped_attention_view
    modeling.grouped_attention_view = lambda base: base
    try:
        yield
    finally:
        modeling.grouped_attention_view = grouped


def copying(run):
    def wrapped(inputs):
        with copying_attention():
            return run(inputs)
    return wrapped


base, tokenizer = load_packaged_model(dtype=torch.float32)
packed = packed_view(base, PackedWeights())
call = dict(max_new_tokens=128, do_sample=False)
methods = [Method("plain generate()", lambda x: (base.generate(x, **call), None)),
           Method("plain generate(), packed weights", lambda x: (packed.generate(x, **call), None))]
for family in ("eagle3", "hydra"):
    model = CerberusForCausalLM.from_pretrained(f"model_cards/{family}-smollm2-135m-instruct", base_model=base)
    run = lambda x, model=model: (model.generate(x, **call), model.generation_stats)
    methods += [Method(f"{family} default, grouped attention", run),
                Method(f"{family} default, sdpa copying keys per head", copying(run))]
prompts = load_bench_prompts("../shared/bench/mt_bench.jsonl", every=int(sys.argv[2]) if len(sys.argv) > 2 else 8)
result = run_methods(methods, encode_prompts(tokenizer, prompts), base.device, warmup=1,
                     eos={base.generation_config.eos_token_id})
print(markdown_table(result))
json.dump(result, open(sys.argv[1], "w"), indent=1)
