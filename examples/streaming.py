"""Streaming: a TextStreamer receives every token once, in order, while the shipped heads draft ahead.

    python examples/streaming.py
"""

from pathlib import Path

from transformers import TextStreamer

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model

HEADS = Path(__file__).resolve().parents[1] / "model_cards" / "hydra-smollm2-135m-instruct"

base, tokenizer = load_packaged_model()
model = CerberusForCausalLM.from_pretrained(HEADS, base_model=base)
messages = [{"role": "user", "content": "Write a haiku about autumn rain."}]
input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
model.generate(input_ids, max_new_tokens=48, streamer=TextStreamer(tokenizer, skip_prompt=True))
print(f"\n(tau {model.generation_stats.tau:.2f})")
