"""Streaming: a TextStreamer receives every token once, in order, while the heads draft ahead.

    python examples/streaming.py
"""

from transformers import TextStreamer

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model

base, tokenizer = load_packaged_model()
model = CerberusForCausalLM.from_base(base)
messages = [{"role": "user", "content": "Write a haiku about autumn rain."}]
input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")["input_ids"]
model.generate(input_ids, max_new_tokens=48, streamer=TextStreamer(tokenizer, skip_prompt=True))
