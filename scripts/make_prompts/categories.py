"""The categories: how many prompts of each (in the order `build` makes them) and each one's generator.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from .coding import gen_js, gen_python, gen_sql
from .conversation import gen_chitchat, gen_roleplay, gen_trivia
from .creative import gen_email, gen_poem, gen_story
from .explain import gen_explain, gen_stem
from .howto import gen_advice, gen_brainstorm, gen_compare, gen_howto, gen_opinion
from .passages import gen_classification, gen_extraction, gen_rewrite, gen_summarize
from .reasoning import gen_logic, gen_math

# How many prompts of each category (1500 in all).
COUNTS = {
    "explain": 80, "howto": 80, "story": 80, "poem": 50, "email_letter": 80, "summarize": 80,
    "rewrite": 80, "brainstorm": 80, "compare": 70, "advice": 80, "coding_python": 90, "coding_js": 45,
    "coding_sql": 45, "math": 100, "logic": 80, "trivia": 100, "roleplay": 50, "extraction": 60,
    "classification": 30, "chitchat": 30, "stem": 70, "opinion": 40,
}


GENERATORS = {
    "explain": gen_explain, "howto": gen_howto, "story": gen_story, "poem": gen_poem, "email_letter": gen_email,
    "summarize": gen_summarize, "rewrite": gen_rewrite, "brainstorm": gen_brainstorm, "compare": gen_compare,
    "advice": gen_advice, "coding_python": gen_python, "coding_js": gen_js, "coding_sql": gen_sql, "math": gen_math,
    "logic": gen_logic, "trivia": gen_trivia, "roleplay": gen_roleplay, "extraction": gen_extraction,
    "classification": gen_classification, "chitchat": gen_chitchat, "stem": gen_stem, "opinion": gen_opinion,
}
