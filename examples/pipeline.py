"""The shipped Hydra heads in `pipeline("text-generation")`, loaded as remote code: the folder holds the heads,
their config and stubs importing cerberus_hf, and finds its base, and the base's tokenizer, from the config.

    python examples/pipeline.py [HEADS_FOLDER]
"""

import sys
from pathlib import Path

from transformers import pipeline

HEADS = Path(__file__).resolve().parents[1] / "model_cards" / "hydra-smollm2-135m-instruct"
folder = sys.argv[1] if len(sys.argv) > 1 else str(HEADS)

generator = pipeline("text-generation", model=folder, trust_remote_code=True)
messages = [{"role": "user", "content": "Name two uses of a paperclip."}]
print(generator(messages, max_new_tokens=48)[0]["generated_text"][-1]["content"])
stats = generator.model.generation_stats
print(f"{stats.new_tokens} tokens in {stats.steps} base forward passes (tau {stats.tau:.2f})")
