"""Prompt generators: explain / STEM.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

from .words import maybe_suffix

EXPLAIN_TOPICS = [
    "inflation", "compound interest", "supply and demand", "the electoral college", "credit scores",
    "blockchain", "cloud computing", "the greenhouse effect", "opportunity cost", "the placebo effect",
    "cognitive dissonance", "the scientific method", "index funds", "the circadian rhythm", "jet lag",
    "the tragedy of the commons", "game theory", "the butterfly effect", "minimalism", "a recession",
    "a mortgage", "open-source software", "a VPN", "an API", "net neutrality", "universal basic income",
    "the gig economy", "stoicism", "confirmation bias", "the sunk cost fallacy", "impostor syndrome",
    "the Dunning-Kruger effect", "carbon offsets", "a Roth IRA", "diminishing returns", "herd immunity",
    "the Renaissance", "the Industrial Revolution", "the Cold War", "feudalism", "the printing press",
    "the Silk Road", "democracy in ancient Athens", "the separation of powers", "a filibuster",
    "cryptocurrency mining", "a 401(k) plan", "a growth mindset", "mindfulness meditation",
    "a balanced diet", "the gut microbiome", "sleep hygiene", "the Pomodoro technique",
]
EXPLAIN_HOW = [
    "vaccines train the immune system", "airplanes stay in the air", "GPS finds your location",
    "noise-cancelling headphones work", "a refrigerator keeps food cold", "the internet routes data",
    "search engines rank web pages", "a bill becomes a law in the United States", "tides are caused",
    "bees make honey", "sourdough bread rises", "a bicycle stays upright", "credit cards make money",
    "leaves change colour in autumn", "a microwave oven heats food", "touch screens detect fingers",
    "a camera lens focuses light", "recycling plants sort materials", "a thermostat controls temperature",
    "a solar panel produces electricity", "antibiotics kill bacteria", "the stock market sets prices",
    "a compass points north", "rainbows form", "an elevator works", "public-key encryption protects messages",
    "a hybrid car saves fuel", "a 3D printer builds objects", "wind turbines generate power",
    "the human eye sees colour", "spam filters recognise junk email", "a lock and key work",
]
AUDIENCES = ["a ten-year-old", "a complete beginner", "a busy executive", "a high school student",
             "my grandmother", "someone learning English", "a curious teenager", "a new employee"]


def gen_explain(rng: Random) -> str:
    if rng.random() < 0.5:
        t = rng.choice(EXPLAIN_TOPICS)
        forms = [f"What is {t}?", f"Explain {t} in simple terms.", f"Can you explain {t} to {rng.choice(AUDIENCES)}?",
                 f"I've never really understood {t}. Could you break it down for me?",
                 f"Give me a clear explanation of {t} in {rng.randint(2, 6)} sentences.",
                 f"Explain {t} using an everyday analogy.", f"Why does {t} matter? Explain briefly.",
                 f"What are the key ideas behind {t}?", f"define {t} and give an example"]
    else:
        h = rng.choice(EXPLAIN_HOW)
        forms = [f"Explain how {h}.",
                 f"Can you explain to {rng.choice(AUDIENCES)} how {h}?", f"I'm curious about how {h}. Can you explain?",
                 f"Describe, step by step, how {h}.", f"In a short paragraph, explain how {h}."]
    return maybe_suffix(rng, rng.choice(forms))


STEM_QUESTIONS = [
    "Explain Newton's second law of motion and show how to use it on a simple example.",
    "What is entropy in thermodynamics, and why does it tend to increase?",
    "Explain the Pythagorean theorem and give a real-world use for it.",
    "What is a derivative in calculus? Explain it intuitively and with a formula.",
    "What does Big-O notation describe? Compare O(n) and O(n log n) with examples.",
    "Describe how DNA is copied during cell division.",
    "What happens in the Krebs cycle, and why is it important for cells?",
    "State Ohm's law and use it to find the current through a 12-ohm resistor connected to a 6-volt battery.",
    "What is the difference between covalent and ionic bonds?",
    "Why do objects of different mass fall at the same rate in a vacuum?",
    "Explain what a standard deviation measures, with a small numerical example.",
    "How does natural selection lead to evolution? Give an example from nature.",
    "What is the difference between speed, velocity and acceleration?",
    "Explain what an eigenvector is in plain language.",
    "How does a transistor work as a switch?",
    "What is the Doppler effect, and where do we encounter it in daily life?",
    "Why do we have seasons on Earth?",
    "What causes earthquakes, and how are they measured?",
    "Explain plate tectonics and how it shaped the continents.",
    "How do lithium-ion batteries store and release energy?",
    "What is the difference between nuclear fission and nuclear fusion?",
    "Explain how the heart pumps blood through the body.",
    "What is a black hole, and how do astronomers detect them?",
    "How do neurons transmit signals?",
    "What is the difference between mass and weight?",
    "Explain the concept of a limit in calculus.",
    "Why is water a good solvent?",
    "What is the pH scale, and what makes a solution acidic or basic?",
    "How does a hash table achieve fast lookups?",
    "Explain recursion and give a simple example in pseudocode.",
    "What is the speed of light, and why can nothing travel faster?",
    "Explain how the immune system distinguishes friend from foe.",
    "What are prime numbers, and why are they important in cryptography?",
    "How does a binary search work, and why is it faster than a linear search?",
    "Explain what a p-value means in a statistics experiment.",
    "What is the difference between correlation and causation? Give an example.",
    "How do greenhouse gases trap heat?",
    "Explain the difference between AC and DC electricity.",
    "What is a chemical catalyst, and how does it speed up a reaction?",
    "How do vaccines based on mRNA work?",
    "What is the law of conservation of energy? Give three everyday examples.",
    "Explain what a logarithm is and why it is useful.",
    "How does sound travel through air, water and solids?",
    "Why does ice float on water?",
    "What is the role of mitochondria in a cell?",
    "Explain the difference between a virus and a bacterium.",
    "What is machine learning overfitting, and how can it be prevented?",
    "How does a neural network learn from data?",
    "Explain the concept of half-life in radioactive decay, with a worked example.",
    "What is the difference between an element, a compound and a mixture?",
    "Explain how an electric motor converts electricity into motion.",
    "Why is the sky dark at night if there are so many stars?",
    "What are the main layers of the Earth's atmosphere?",
    "Explain how vaccines and herd immunity protect people who cannot be vaccinated.",
    "What is Bayes' theorem? Walk through a medical test example.",
]
STEM_TOPICS = ["osmosis", "photosynthesis", "the water cycle", "kinetic energy", "inertia", "friction",
               "electromagnetic induction", "the periodic table", "chemical equilibrium", "genetic mutation",
               "the nitrogen cycle", "refraction of light", "buoyancy", "vectors", "matrices", "probability",
               "the Fibonacci sequence", "sorting algorithms", "boolean logic", "binary numbers",
               "compilers", "operating systems", "photosynthesis versus cellular respiration",
               "gravity", "magnetism", "static electricity", "protein synthesis", "the carbon cycle"]


def gen_stem(rng: Random) -> str:
    if rng.random() < 0.55:
        return maybe_suffix(rng, rng.choice(STEM_QUESTIONS), 0.2)
    t = rng.choice(STEM_TOPICS)
    forms = [f"Explain {t} and give an example.", f"What should a first-year student know about {t}?",
             f"Teach me the basics of {t}.", f"Write a short study guide on {t}.",
             f"What are common misconceptions about {t}?", f"Give me three practice questions about {t}, with answers."]
    return maybe_suffix(rng, rng.choice(forms), 0.2)
