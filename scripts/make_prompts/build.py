"""Making the prompt set: each category's distinct prompts, shuffled, with their ids.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

import collections
from random import Random

from cerberus_hf.training.data import words

from .categories import COUNTS, GENERATORS

def build(seed: int) -> list[dict]:
    rng = Random(seed)
    prompts, seen = [], set()
    for category, count in COUNTS.items():
        made, tries = 0, 0
        while made < count:
            tries += 1
            if tries > 200 * count:
                raise RuntimeError(f"{category}: only {made} distinct prompts after {tries} tries")
            text = GENERATORS[category](rng).strip()
            key = " ".join(words(text))
            if key in seen:
                continue
            seen.add(key)
            made += 1
            prompts.append({"category": category, "turns": [text]})
    rng.shuffle(prompts)  # a prefix (--limit) is then a mix of all categories
    per_category = collections.Counter()
    out = []
    for p in prompts:
        per_category[p["category"]] += 1
        out.append({"id": f"{p['category']}-{per_category[p['category']]:04d}", "turns": p["turns"], "category": p["category"]})
    return out
