"""A saved head checkpoint in `pipeline("text-generation")`, loaded as remote code.

    python examples/pipeline.py /tmp/my-heads
"""

import sys

from transformers import pipeline

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_packaged_model

folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/cerberus-smollm2-heads"
base, tokenizer = load_packaged_model()
CerberusForCausalLM.from_base(base).save_pretrained(folder)  # heads, config, stubs importing cerberus_hf; no base weights
tokenizer.save_pretrained(folder)  # so the pipeline finds a tokenizer next to the heads

generator = pipeline("text-generation", model=folder, trust_remote_code=True)
messages = [{"role": "user", "content": "Name two uses of a paperclip."}]
print(generator(messages, max_new_tokens=48)[0]["generated_text"][-1]["content"])
print(generator.model.generation_stats.as_dict())
