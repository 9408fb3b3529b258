"""The word lists several categories share (names, cities) and the optional style suffix.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

NAMES = ["Maya", "Liam", "Aisha", "Tomas", "Chen", "Priya", "Oskar", "Fatima", "Diego", "Hana", "Kwame",
         "Sofia", "Yusuf", "Elena", "Ravi", "Grace", "Mateo", "Nadia", "Jonas", "Amara", "Felix", "Ines",
         "Kenji", "Leila", "Marco", "Zoe", "Arjun", "Clara", "Emeka", "Freya"]
CITIES = ["Lisbon", "Kyoto", "Buenos Aires", "Edinburgh", "Cape Town", "Vancouver", "Istanbul", "Hanoi",
          "Prague", "Marrakesh", "Melbourne", "Reykjavik", "Mexico City", "Seoul", "Copenhagen", "Lima",
          "Vienna", "Singapore", "Nairobi", "Montreal", "Barcelona", "Krakow", "Dubrovnik", "Chicago"]

# Optional format / style instructions appended to some prompts.
SUFFIXES = ["Keep it brief.", "Answer in under 100 words.", "Use bullet points.", "Explain step by step.",
            "Give one concrete example.", "Write it for a beginner.", "Be concise but complete.",
            "Use a friendly tone.", "Answer in two short paragraphs.", "Start with a one-sentence summary."]


def maybe_suffix(rng: Random, text: str, p: float = 0.25) -> str:
    return f"{text} {rng.choice(SUFFIXES)}" if rng.random() < p else text
