"""Prompt generators: creative writing (stories, poems, emails and letters).

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

CHARACTERS = ["a retired lighthouse keeper", "a shy robot", "a young witch", "a detective who is afraid of the dark",
              "a talking fox", "an astronaut on her last mission", "a baker who can taste emotions", "two rival chess players",
              "a lost penguin", "a time-travelling historian", "a grumpy dragon", "a street musician", "a ghost who wants friends",
              "a girl who collects maps", "an old fisherman", "a clumsy knight", "a librarian with a secret", "a twelve-year-old inventor",
              "a cat who runs a hotel", "a farmer on Mars", "a courier in a flooded city", "a sleepy bear", "an AI assistant",
              "a mountain guide", "a village postman", "a pirate who hates the sea"]
SITUATIONS = ["finds a door that wasn't there yesterday", "has to win a baking contest", "loses their voice before a big concert",
              "discovers a message in a bottle", "must cross a desert in three days", "accidentally swaps lives with a stranger",
              "receives a letter from the future", "tries to return a stolen painting", "befriends an unlikely creature",
              "gets stuck in an elevator with a celebrity", "has one day to save the town festival", "learns to fly",
              "wakes up in a world without colour", "is the last person to leave a sinking ship", "plants a tree that grows overnight",
              "hears the stars singing", "opens a shop that sells memories", "must apologise to an old enemy",
              "finds a map with their own name on it", "runs for mayor"]
SETTINGS = ["a snowy mountain village", "a busy space station", "a floating market", "a small island", "an underground city",
            "a Victorian London street", "a desert oasis", "a rainforest", "a quiet suburb", "a medieval castle",
            "a night train across Europe", "a coral reef", "a city in the clouds", "a school for magicians", "an abandoned amusement park"]
GENRES = ["funny", "heartwarming", "mystery", "science fiction", "fantasy", "adventure", "spooky but kid-friendly", "bittersweet"]


def gen_story(rng: Random) -> str:
    c, s, where, g = rng.choice(CHARACTERS), rng.choice(SITUATIONS), rng.choice(SETTINGS), rng.choice(GENRES)
    n = rng.choice([100, 150, 200, 250, 300])
    forms = [f"Write a short {g} story about {c} who {s}.",
             f"Write a {g} story set in {where} about {c} who {s}. Keep it under {n} words.",
             f"Tell me a bedtime story about {c}.", f"Write the opening paragraph of a {g} novel set in {where}.",
             f"Write a {n}-word story about {c} in {where}.", f"Write a piece of flash fiction in which {c} {s}.",
             f"Write a dialogue between {c} and {rng.choice(CHARACTERS)} who meet in {where}.",
             f"Give me a story idea about {c} who {s}, then write the first scene."]
    return rng.choice(forms)


POEM_TOPICS = ["the ocean at dawn", "a rainy Monday", "friendship", "autumn leaves", "a city at night", "my first bicycle",
               "the moon", "coffee", "a lost glove", "the end of summer", "learning to code", "a mountain hike", "grandmother's kitchen",
               "the first snow", "a train station", "hope", "a cat sleeping in the sun", "the stars", "homework", "a lighthouse",
               "time", "spring flowers", "the desert", "a thunderstorm", "an old photograph", "a garden", "silence", "a long journey"]
POEM_FORMS = ["a haiku", "a limerick", "a sonnet", "a free-verse poem", "a four-line rhyming poem", "a short poem",
              "two haiku", "a poem in three stanzas", "a funny rhyming poem", "a poem for children"]


def gen_poem(rng: Random) -> str:
    t, f = rng.choice(POEM_TOPICS), rng.choice(POEM_FORMS)
    forms = [f"Write {f} about {t}.", f"Compose {f} about {t}.", f"Can you write me {f} about {t}?",
             f"Write an acrostic poem for the word {rng.choice(['RAIN', 'HOPE', 'OCEAN', 'SPRING', 'LIGHT', 'MUSIC', 'FRIEND'])}.",
             f"Write {f} about {t} in the style of a nursery rhyme."]
    return rng.choice(forms)


EMAILS = [
    ("my landlord", "asking him to fix a leaking kitchen faucet"), ("my team", "announcing that the project deadline moved by a week"),
    ("a customer", "apologising for a delayed delivery"), ("my professor", "asking for an extension on an essay"),
    ("a hiring manager", "following up after an interview"), ("my neighbours", "inviting them to a street party"),
    ("a supplier", "asking for a discount on a bulk order"), ("a colleague", "thanking them for covering my shift"),
    ("the city council", "reporting a broken streetlight"), ("a client", "proposing a call to discuss next steps"),
    ("my gym", "cancelling my membership"), ("a conference organiser", "proposing a talk about data privacy"),
    ("my child's teacher", "explaining an absence"), ("the HR department", "requesting two weeks of vacation"),
    ("a former colleague", "asking for a LinkedIn recommendation"), ("an airline", "requesting a refund for a cancelled flight"),
    ("a new team member", "welcoming her to the company"), ("my book club", "suggesting next month's book"),
    ("a restaurant", "booking a table for a party of twelve"), ("a hotel", "complaining about a noisy room"),
    ("a volunteer group", "asking for help at a charity run"), ("my manager", "declining a meeting politely"),
    ("a software vendor", "reporting a bug in their app"), ("an old friend", "reconnecting after ten years"),
]
LETTERS = ["a cover letter for a junior graphic designer position", "a thank-you letter to a mentor",
           "a letter of complaint to a phone company about billing errors", "a letter to my future self",
           "a reference letter for a former intern", "a resignation letter that keeps good relations",
           "a letter to a pen pal in another country", "a letter to the editor about bike lanes",
           "a letter to a favourite author", "a letter asking a local business to sponsor a youth football team"]
TONES = ["polite", "friendly", "formal", "short", "warm", "firm but polite", "professional", "casual"]


def gen_email(rng: Random) -> str:
    if rng.random() < 0.7:
        who, why = rng.choice(EMAILS)
        tone = rng.choice(TONES)
        forms = [f"Write a {tone} email to {who} {why}.", f"Draft an email to {who} {why}. Keep the tone {tone}.",
                 f"Help me write an email to {who} {why}.", f"Write a {tone} message to {who} {why}, in under 120 words."]
        return rng.choice(forms)
    letter = rng.choice(LETTERS)
    return rng.choice([f"Write {letter}.", f"Draft {letter}.", f"Help me write {letter}. Use a {rng.choice(TONES)} tone."])
