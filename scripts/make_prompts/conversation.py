"""Prompt generators: trivia / role-play / chit-chat.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

from .explain import EXPLAIN_TOPICS
from .passages import JOBS
from .words import CITIES

COUNTRIES = ["Australia", "Canada", "Brazil", "Japan", "Kenya", "Norway", "Argentina", "Egypt", "India", "Mexico", "Vietnam",
             "Portugal", "Chile", "New Zealand", "Morocco", "Finland", "Peru", "Thailand", "Ghana", "Poland", "Turkey",
             "Indonesia", "Ireland", "South Korea", "Iceland", "Switzerland", "Colombia", "Nigeria", "Greece", "Mongolia"]
PEOPLE = ["Marie Curie", "Leonardo da Vinci", "Nelson Mandela", "Ada Lovelace", "Isaac Newton", "Cleopatra", "Genghis Khan",
          "Frida Kahlo", "Albert Einstein", "Mahatma Gandhi", "Charles Darwin", "Florence Nightingale", "Wolfgang Amadeus Mozart",
          "Alan Turing", "Rosalind Franklin", "Galileo Galilei", "Queen Victoria", "Napoleon Bonaparte", "Harriet Tubman",
          "Nikola Tesla", "Confucius", "Simon Bolivar", "Jane Austen", "Ibn Battuta", "Katherine Johnson", "Louis Pasteur"]
EVENTS = ["the fall of the Berlin Wall", "the first Moon landing", "the Black Death", "the invention of the printing press",
          "the French Revolution", "the building of the Great Wall of China", "the end of apartheid in South Africa",
          "the Wright brothers' first flight", "the Meiji Restoration", "the discovery of penicillin", "the Great Depression",
          "the signing of the Magna Carta", "the eruption of Mount Vesuvius in 79 AD", "the fall of Constantinople in 1453",
          "the launch of Sputnik", "the Irish potato famine", "the construction of the Panama Canal", "the American Civil War"]
SCIENCE_FACTS = ["What is the chemical symbol for gold?", "How many bones are in the adult human body?", "What is the largest planet in our solar system?",
                 "What gas do plants absorb from the air?", "What is the hardest natural substance?", "How far is the Moon from the Earth?",
                 "What is the boiling point of water in Fahrenheit?", "Which organ produces insulin?", "What is the most abundant gas in Earth's atmosphere?",
                 "How long does light from the Sun take to reach Earth?", "What is the smallest unit of life?", "Which planet has the most moons?",
                 "What is the freezing point of water in Kelvin?", "Who proposed the theory of general relativity?", "What is the chemical formula of table salt?",
                 "What is the longest river in Africa?", "Which is the deepest ocean trench?", "What is the tallest mountain in South America?",
                 "Which desert is the largest hot desert in the world?", "How many time zones does Russia have?", "Which country has the most islands?",
                 "What is the largest lake in Africa?", "Which two countries share the longest international border?"]


def gen_trivia(rng: Random) -> str:
    k = rng.randrange(5)
    if k == 0:
        c = rng.choice(COUNTRIES)
        return rng.choice([f"What is the capital of {c}?", f"Tell me {rng.randint(3, 5)} interesting facts about {c}.",
                           f"What languages are spoken in {c}?", f"Describe the geography of {c} briefly.",
                           f"What is {c} famous for?"])
    if k == 1:
        p = rng.choice(PEOPLE)
        return rng.choice([f"Who was {p}, and what is this person best known for?", f"Give me a short biography of {p}.",
                           f"What were the most important achievements of {p}?", f"Why is {p} remembered today?"])
    if k == 2:
        e = rng.choice(EVENTS)
        return rng.choice([f"What caused {e}?", f"Briefly describe {e}.", f"When did {e} happen, and why does it matter?",
                           f"What were the consequences of {e}?"])
    if k == 3:
        return rng.choice(SCIENCE_FACTS)
    a, b = rng.sample(COUNTRIES, 2)
    return rng.choice([f"Which is larger by area, {a} or {b}?", f"Which has the larger population, {a} or {b}?",
                       f"What currency is used in {a}?", f"On which continent is {a}?"])


ROLES = [
    ("a medieval blacksmith", "A customer asks you to make a sword. What do you say?"),
    ("a friendly museum guide", "Welcome me to the dinosaur hall."), ("a strict but kind piano teacher", "I haven't practised all week."),
    ("a ship's captain in a storm", "Give orders to your crew."), ("a tour guide in ancient Rome", "Show me around the Forum."),
    ("a customer support agent for an internet provider", "My connection keeps dropping every evening."),
    ("a personal trainer", "I want to do a 20-minute workout at home with no equipment."),
    ("a detective interviewing a witness", "Ask me about what I saw last night."),
    ("a wise old wizard", "I am a young apprentice who just set the library on fire."),
    ("a barista at a busy cafe", "I can't decide what to order."), ("a sports commentator", "Describe the last minute of a tied football final."),
    ("a cat", "Explain why you knocked the glass off the table."), ("a Socratic tutor", "Help me understand why the Earth is round without telling me the answer."),
    ("an astronaut on the International Space Station", "Describe your morning routine."),
    ("a librarian", "I want a book like Harry Potter but for adults."), ("a chef on a cooking show", "Present today's dish to the audience."),
    ("a grumpy pirate", "Tell me about the treasure you lost."), ("a career counsellor", "I'm 17 and I have no idea what to study."),
]


def gen_roleplay(rng: Random) -> str:
    k = rng.randrange(4)
    if k == 0:
        role, line = rng.choice(ROLES)
        return rng.choice([f"Pretend you are {role}. {line}", f"You are {role}. {line}", f"Role-play as {role}. {line}"])
    if k == 1:
        return f"Act as a travel agent and plan a {rng.randint(2, 5)}-day trip to {rng.choice(CITIES)} for {rng.choice(['a family with two kids', 'a student on a budget', 'a couple who love food', 'a solo hiker'])}."
    if k == 2:
        return f"You're interviewing me for a {rng.choice(JOBS)} position. Ask me your first question, then wait for my answer."
    return f"Explain {rng.choice(EXPLAIN_TOPICS)} as if you were {rng.choice(['a pirate', 'a sports coach', 'a fairy-tale narrator', 'a robot from the future', 'a nervous tour guide', 'a cowboy'])}."


CHITCHAT = [
    "hi", "Hello! How are you today?", "Good morning! What should I have for breakfast?", "Tell me a joke.",
    "I'm feeling a bit down today.", "What's a good movie for a rainy evening?", "Can you recommend a book for a long flight?",
    "I'm bored. Any ideas?", "What's your favourite season and why?", "Tell me a fun fact.", "thanks for your help!",
    "Can you keep me company for a minute?", "What should I name my new plant?", "I just finished my first marathon!",
    "Say something to cheer me up.", "Do you like music?", "What's something interesting I could learn today?",
    "I can't sleep. Talk to me about something calming.", "Tell me a riddle.", "Who are you?", "What can you help me with?",
    "I got the job!!", "My cat just did the funniest thing.", "Recommend a song for a road trip.", "Is it weird to eat cereal for dinner?",
    "Give me a motivational quote for Monday morning.", "What do you think makes a good friend?", "Tell me a joke about computers.",
    "What's a good hobby to pick up in winter?", "Tell me a short tongue twister.", "Why do cats purr?", "Tell me a joke about teachers.",
    "good night!", "What's the best way to spend a lazy Sunday?", "Tell me something that will make me smile.",
]


def gen_chitchat(rng: Random) -> str:
    return rng.choice(CHITCHAT)
