"""Build cerberus_hf/data/prompts.jsonl: a diverse, original prompt set for self-distillation.

Every prompt is made here from templates and word lists written for this project (no benchmark or
public dataset text). The script is deterministic for a given --seed. It finishes with a contamination
check: no prompt may share a run of 8 or more words with any question of the MT-Bench file (kept for
evaluation only); the check result is printed and the script exits non-zero on a hit.

    python scripts/make_prompts.py [--seed 0] [--output cerberus_hf/data/prompts.jsonl]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path
from random import Random

from cerberus_hf.training.data import MT_BENCH_QUESTIONS, OVERLAP_WORDS, Decontaminator, words

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = ROOT / "cerberus_hf" / "data" / "prompts.jsonl"

# How many prompts of each category (1500 in all).
COUNTS = {
    "explain": 80, "howto": 80, "story": 80, "poem": 50, "email_letter": 80, "summarize": 80,
    "rewrite": 80, "brainstorm": 80, "compare": 70, "advice": 80, "coding_python": 90, "coding_js": 45,
    "coding_sql": 45, "math": 100, "logic": 80, "trivia": 100, "roleplay": 50, "extraction": 60,
    "classification": 30, "chitchat": 30, "stem": 70, "opinion": 40,
}

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


# --------------------------------------------------------------------------------------------------------
# explain / STEM
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# how-to / advice / opinion / brainstorm / compare
# --------------------------------------------------------------------------------------------------------

HOWTO_TASKS = [
    "change a flat tire", "make a monthly budget", "start running as a beginner", "prepare for a job interview",
    "brew pour-over coffee", "set up a home Wi-Fi network securely", "remove a red wine stain from a carpet",
    "write a good resume", "learn to juggle three balls", "grow tomatoes on a balcony", "back up my phone",
    "bake bread without yeast", "negotiate a higher salary", "fall asleep faster", "clean a cast-iron pan",
    "memorise a speech", "train a puppy to sit", "start a vegetable compost", "learn a new language on my own",
    "organise a small closet", "fix a squeaky door", "make a good first impression", "plan a road trip",
    "start journaling", "reduce my screen time", "meal prep for a week", "paint a room",
    "tie a bowline knot", "create a strong password", "take better photos with my phone",
    "write a cover letter", "change a bike chain", "unclog a kitchen sink", "make fresh pasta",
    "prepare for a 10k race", "study for a maths exam", "start a podcast", "sew on a button",
    "care for a succulent", "keep houseplants alive while on holiday", "use a spreadsheet to track expenses",
    "give constructive feedback to a colleague", "run an effective meeting", "make friends as an adult",
    "save money on groceries", "wake up earlier", "learn to touch type", "pack a suitcase efficiently",
    "set up a Python virtual environment", "use git to undo my last commit", "make a simple website",
    "write a haiku", "calm down before an exam", "boil an egg perfectly", "replace a light switch safely",
]


def gen_howto(rng: Random) -> str:
    t = rng.choice(HOWTO_TASKS)
    forms = [f"How do I {t}?", f"What's the best way to {t}?", f"Give me step-by-step instructions to {t}.",
             f"I'm a total beginner. How can I {t}?", f"Walk me through how to {t} in at most {rng.randint(4, 8)} steps.",
             f"how to {t}", f"Any tips on how to {t}?", f"What mistakes should I avoid when I {t}?",
             f"Can you teach me to {t}? I have about {rng.choice(['ten minutes', 'an hour', 'a weekend'])}."]
    return maybe_suffix(rng, rng.choice(forms), 0.2)


ADVICE_SITUATIONS = [
    "I just moved to a new city and I don't know anyone.", "My coworker keeps taking credit for my work.",
    "I have two job offers and can't decide between them.", "I procrastinate on everything important.",
    "My roommate never does the dishes.", "I get very nervous before presentations.",
    "I want to switch careers into software development at 35.", "My teenage son spends all night gaming.",
    "I feel burned out at work.", "My best friend forgot my birthday and I feel hurt.",
    "I want to start saving for retirement but I have student loans.", "I keep forgetting people's names.",
    "My neighbour's dog barks all night.", "I want to read more books but never find the time.",
    "I was rejected from my dream university.", "My manager gives vague instructions.",
    "I'm planning my first trip abroad alone.", "I struggle to stay motivated when working from home.",
    "My parents disagree with my choice of study.", "I want to get fit but I hate the gym.",
    "I have a big exam in three days and haven't started studying.", "I overspend every month.",
    "I'm going to be a manager for the first time next week.", "I feel lonely on weekends.",
    "My small bakery is losing customers to a new chain store.", "I can't stop checking my phone at night.",
    "A friend asked to borrow a large amount of money.", "I want to ask for a raise but I'm scared.",
    "I'm a new parent and I'm exhausted.", "I have too many hobbies and finish none of them.",
    "My team at work doesn't communicate well.", "I'm adopting a cat and have never had pets.",
    "I want to learn to cook but only have a tiny kitchen.", "I disagree with a decision my boss made.",
    "I get into arguments with my sibling about politics.", "My commute is two hours a day.",
    "I want to volunteer but don't know where to start.", "I've been offered a job in another country.",
    "I feel like I'm not good enough compared to my classmates.", "I need to give bad news to a client.",
]


def gen_advice(rng: Random) -> str:
    s = rng.choice(ADVICE_SITUATIONS)
    forms = [f"{s} What should I do?", f"{s} Any advice?", f"Advice needed: {s}", f"{s} How do I handle this?",
             f"{s} Can you help me think it through?", f"{s} What are my options?",
             f"{s} Give me {rng.randint(3, 6)} practical suggestions."]
    return rng.choice(forms)


OPINION_TOPICS = [
    "remote work", "nuclear energy", "school uniforms", "social media for teenagers", "a four-day work week",
    "electric scooters in cities", "homework for primary school children", "self-driving cars",
    "living in a big city", "learning Latin in school", "open-plan offices", "cashless societies",
    "standardised testing", "space tourism", "fast fashion", "tiny houses", "online dating",
    "year-round schooling", "lab-grown meat", "daylight saving time", "banning cars from city centres",
    "video games as a sport", "public libraries in the digital age", "gap years", "smart home devices",
    "studying abroad", "freelancing", "buying a used car", "working at a startup", "learning to code at school",
]


def gen_opinion(rng: Random) -> str:
    t = rng.choice(OPINION_TOPICS)
    forms = [f"What are the pros and cons of {t}?", f"Give a balanced view on {t}.",
             f"Make the strongest case for and against {t}.", f"Is {t} a good idea? Argue both sides.",
             f"Write a short persuasive paragraph in favour of {t}.", f"Write a short paragraph arguing against {t}.",
             f"What do critics say about {t}, and how do supporters respond?"]
    return maybe_suffix(rng, rng.choice(forms), 0.15)


BRAINSTORM = [
    "names for a coffee shop", "birthday party themes for a seven-year-old", "ways to reduce plastic at home",
    "science fair project ideas", "blog post titles about personal finance", "team-building activities for a remote team",
    "creative uses for an old ladder", "weekend activities on a tight budget", "names for a fantasy kingdom",
    "questions to ask at the end of a job interview", "healthy snacks for work", "gift ideas for a gardener",
    "themes for a school dance", "slogans for a bike-sharing service", "ways to practise gratitude",
    "rainy-day activities for kids", "side business ideas for a student", "ideas for a short film",
    "icebreaker questions for a workshop", "features for a to-do list app", "names for a golden retriever",
    "ways to make a small apartment feel bigger", "topics for a podcast about history", "vegetarian dinner ideas",
    "ways to celebrate a colleague's retirement", "fundraising ideas for a local animal shelter",
    "conversation starters for a first date", "board game ideas based on space exploration",
    "ways to stay cool without air conditioning", "ideas for a community garden event", "classroom rules for a fun classroom",
    "mobile app ideas that help the elderly", "ways to learn vocabulary faster", "plot twists for a mystery novel",
    "names for a robot character", "ways to reuse glass jars", "photography project ideas", "ideas for a family reunion",
    "Instagram captions for a beach photo", "things to pack for a camping trip",
]


def gen_brainstorm(rng: Random) -> str:
    t = rng.choice(BRAINSTORM)
    n = rng.choice([3, 5, 5, 7, 8, 10, 10, 12])
    forms = [f"List {n} {t}.", f"Brainstorm {n} {t}.", f"Give me {n} {t}.", f"Can you suggest some {t}?",
             f"I need {t}. Give me {n} options with a one-line explanation each.", f"Come up with {n} original {t}."]
    return rng.choice(forms)


COMPARE_PAIRS = [
    ("cats", "dogs as pets"), ("Python", "JavaScript for a first programming language"), ("renting", "buying a home"),
    ("electric cars", "petrol cars"), ("stocks", "bonds"), ("TCP", "UDP"), ("mitosis", "meiosis"),
    ("viruses", "bacteria"), ("tea", "coffee"), ("e-books", "printed books"), ("SQL", "NoSQL databases"),
    ("nuclear power", "solar power"), ("working from home", "working in an office"),
    ("the Roman Republic", "the Roman Empire"), ("weather", "climate"), ("a laptop", "a desktop computer"),
    ("running", "swimming for fitness"), ("public schools", "private schools"), ("trains", "planes for travel in Europe"),
    ("classical music", "jazz"), ("capitalism", "socialism"), ("a credit card", "a debit card"),
    ("lists", "tuples in Python"), ("RAM", "storage"), ("baking soda", "baking powder"),
    ("the French Revolution", "the American Revolution"), ("monarchy", "republic"), ("frogs", "toads"),
    ("alligators", "crocodiles"), ("a virus", "a worm in computer security"), ("Git merge", "Git rebase"),
    ("introverts", "extroverts"), ("yoga", "pilates"), ("Spanish", "Italian for an English speaker to learn"),
    ("a PhD", "industry experience"), ("HTTP", "HTTPS"), ("weight training", "cardio"), ("LED", "incandescent bulbs"),
    ("Mars", "Venus"), ("hurricanes", "tornadoes"),
]


def gen_compare(rng: Random) -> str:
    a, b = rng.choice(COMPARE_PAIRS)
    forms = [f"Compare {a} and {b}.", f"What are the main differences between {a} and {b}?",
             f"Make a table comparing {a} and {b} on {rng.randint(3, 6)} criteria.",
             f"Contrast {a} with {b} in a short paragraph.", f"{a[0].upper() + a[1:]} vs {b}: which should I choose, and why?",
             f"How are {a} and {b} similar, and how are they different?"]
    return maybe_suffix(rng, rng.choice(forms), 0.15)


# --------------------------------------------------------------------------------------------------------
# creative writing
# --------------------------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------------------------
# passages: summarise / rewrite / extraction / classification
# --------------------------------------------------------------------------------------------------------

PASSAGES = [
    "The town of Brindle Falls voted last week to turn its old railway line into a walking and cycling path. "
    "Supporters say the path will bring tourists and give residents a safe way to commute, while some farmers "
    "worry about strangers crossing their fields. The council has promised fences along the route and plans to "
    "open the first five kilometres next spring.",
    "Octopuses are remarkable problem solvers. In laboratory tests they have opened screw-top jars, escaped from "
    "tanks and recognised individual keepers. Each of their eight arms contains a large share of their neurons, "
    "which lets the arms react to touch and taste on their own. Scientists study them to learn how intelligence "
    "can evolve in animals very different from us.",
    "Our quarterly survey found that customers love the new checkout page, which is faster and easier to use. "
    "However, complaints about delivery times rose by twelve percent, mostly from rural areas. The logistics team "
    "suggests adding a second warehouse in the north, which would cost about two million dollars but cut average "
    "delivery time by a day.",
    "Sleep is not a passive state. During deep sleep the brain sorts the day's memories, keeping some and "
    "discarding others, and clears out waste products that build up while we are awake. Adults who regularly "
    "sleep less than six hours have a higher risk of heart disease, and their reaction times resemble those of "
    "people who have been drinking.",
    "In 1910 a small bakery opened on Harbour Street selling only rye bread. Over the next century it survived two "
    "wars, a fire and a flood. Today the great-granddaughter of the founder runs it, and although the menu now "
    "includes croissants and vegan cakes, the original rye recipe is still baked every morning at four o'clock.",
    "The new library app lets members borrow e-books, reserve study rooms and pay fines from their phones. In its "
    "first month it was downloaded eight thousand times. Librarians report fewer queues at the desk, but older "
    "members say the app is confusing, so the library will run free weekly workshops on how to use it.",
    "Coral reefs cover less than one percent of the ocean floor but support about a quarter of all marine species. "
    "Rising sea temperatures cause corals to expel the algae that live inside them, turning them white in a process "
    "called bleaching. If temperatures fall quickly enough the corals can recover; if not, they starve.",
    "Maria started her online pottery shop as a hobby during a long winter. She posted photos of her mugs on social "
    "media, and within a year she had orders from twelve countries. She now rents a studio, employs two part-time "
    "assistants, and says the hardest part is not making pottery but packing it so it arrives unbroken.",
    "The proposed four-day school week would add forty minutes to each remaining day. The district says it would "
    "save on bus and heating costs and help recruit teachers. Parents are divided: some welcome a long weekend with "
    "their children, while working parents worry about finding childcare on Fridays.",
    "Honeybees communicate using a 'waggle dance'. A forager returning to the hive moves in a figure-eight pattern, "
    "and the angle of the straight part of the dance shows the direction of the flowers relative to the sun, while "
    "its length shows how far away they are. Other bees watch the dance and then fly straight to the food.",
    "Last night's storm knocked down power lines across the eastern districts, leaving about 30,000 homes without "
    "electricity. Crews worked through the night and restored power to most areas by morning. The utility company "
    "expects the remaining homes to be reconnected by Thursday and asks residents to stay away from fallen cables.",
    "The first commercially successful steam engine was built in 1712 to pump water out of coal mines. It was "
    "inefficient, burning huge amounts of coal, but it worked. Later improvements, especially a separate condenser, "
    "made steam power cheap enough to drive factories, ships and trains, transforming economies within a century.",
    "Researchers followed 2,000 office workers for a year. Those who took a short walk after lunch reported better "
    "mood and concentration in the afternoon than those who stayed at their desks. The effect was strongest on "
    "sunny days, and the walk did not need to be long: ten minutes was enough to make a difference.",
    "The museum's new exhibition brings together sixty paintings of the sea from four centuries. Early works show "
    "ships and battles; later ones focus on light, waves and weather. The final room is empty except for the sound "
    "of waves recorded on the coast nearby, inviting visitors to imagine their own painting.",
    "Our software release has been delayed by two weeks. Testing found a bug that can corrupt saved files when the "
    "disk is almost full. The fix is ready, but we want to run the full test suite again on all supported systems. "
    "Customers who need the new reporting feature urgently can request early access to a beta version.",
    "Tomatoes were once considered poisonous in parts of Europe, partly because they belong to the nightshade "
    "family and partly because acidic tomato juice could leach lead from pewter plates. By the nineteenth century "
    "they had become a staple of Italian cooking, and today they are among the most widely grown vegetables.",
    "The hiking club's autumn trip will visit the Granite Lakes. The route is 14 kilometres with 600 metres of "
    "climbing and takes about six hours. Participants need boots, waterproof clothing, a packed lunch and at least "
    "two litres of water. The bus leaves the town hall at 7:30 on Saturday and returns around 6 pm.",
    "Children who learn a musical instrument often show improvements in memory and attention, although scientists "
    "debate whether music causes these gains or whether children who stick with lessons already differ in other "
    "ways. What most researchers agree on is that music lessons do no harm and give children a lasting source of joy.",
    "Urban foxes have become common in many European cities. They eat scraps, rodents and fruit, and they have "
    "learned to cross roads at quieter times of night. Most residents enjoy seeing them, though some complain about "
    "noise during the mating season and about foxes digging in gardens.",
    "The company will switch to a hybrid work policy from next month. Employees will work in the office on "
    "Tuesdays and Thursdays and may choose where to work on other days. Desks will no longer be assigned; instead, "
    "staff book a desk through an app. Managers will review the policy after six months.",
]

REWRITE_SENTENCES = [
    "me and him goes to the store yesterday and buyed some apples",
    "The meeting, which was scheduled for Monday, has been moved, due to the fact that many people are unavailable, to Wednesday.",
    "hey can u send me that file asap thx",
    "The results of the experiment were analyzed by the team.",
    "Our product is good and people like it and it is cheap.",
    "I am writing to inform you that your subscription has expired and that you need to renew it.",
    "their going to there house after the game, its going to be fun",
    "The cat sat on the windowsill and watched the birds all afternoon.",
    "It is with great pleasure that we announce the opening of our new branch.",
    "The report was written by Sarah and it was reviewed by the manager.",
    "We need to leverage our synergies to maximize stakeholder value going forward.",
    "The weather was bad so we stayed inside and played cards.",
    "Please ensure that all doors are locked before leaving the premises.",
    "i dont think this is a good idea becuase it will cost to much money",
    "The new phone has a bigger screen, a better camera, and a longer battery life than the old one.",
    "Due to unforeseen circumstances, the concert has been cancelled.",
    "Learning to play the guitar takes patience, practice, and a lot of sore fingers.",
    "Every morning, the old man feeds the pigeons in the park.",
    "Thank you very much for your help, I really appreciate it.",
    "The train was late, so I missed the beginning of the film.",
    "Our team achieved record sales this quarter despite a difficult market.",
    "Could you please tell me where the nearest train station is?",
    "she have been working here since three years",
    "The garden looks beautiful in spring when all the flowers are blooming.",
    "Water boils at one hundred degrees Celsius at sea level.",
]
REWRITE_OPS = [
    "Rewrite this sentence to sound more formal:", "Fix the grammar and spelling:", "Make this more concise:",
    "Translate into French:", "Translate into Spanish:", "Translate into German:", "Translate into Italian:",
    "Rewrite in the active voice:", "Rewrite this as a short, catchy tweet:", "Paraphrase this sentence:",
    "Make this sound more enthusiastic:", "Rewrite this for a five-year-old:", "Make this sentence more polite:",
    "Turn this sentence into a question:", "Rewrite this in the style of a news headline:",
]


def gen_rewrite(rng: Random) -> str:
    s = rng.choice(REWRITE_SENTENCES)
    if rng.random() < 0.2:
        p = rng.choice(PASSAGES)
        op = rng.choice(["Rewrite this paragraph in a more casual tone:", "Rewrite this paragraph for a children's magazine:",
                         "Shorten this paragraph to about half its length:", "Rewrite this paragraph as a short news report:",
                         "Translate this paragraph into Spanish:", "Rewrite this paragraph in the first person:"])
        return f"{op}\n\n{p}"
    op = rng.choice(REWRITE_OPS)
    return rng.choice([f"{op}\n\n{s}", f"{op} \"{s}\"", f"{op} {s}"])


def gen_summarize(rng: Random) -> str:
    p = rng.choice(PASSAGES)
    ops = ["Summarise the following text in one sentence:", "Give me three bullet-point takeaways from this passage:",
           "Write a headline for this paragraph:", "Explain this passage to a child:", "TL;DR:",
           "Summarize this in under 30 words:", "What is the main point of this text?",
           "Read the passage and list the key facts:", "Write a two-sentence summary:",
           "What questions might a reader have after reading this?"]
    op = rng.choice(ops)
    return f"{op}\n\n{p}" if rng.random() < 0.7 else f"{p}\n\n{op}"


ITEMS = [("wireless mouse", 24.99), ("USB-C cable", 9.5), ("notebook", 3.25), ("desk lamp", 39.0), ("coffee beans (1 kg)", 18.75),
         ("yoga mat", 29.9), ("water bottle", 14.0), ("phone case", 12.49), ("headphones", 79.0), ("backpack", 54.5)]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
JOBS = ["nurse", "software engineer", "chef", "architect", "teacher", "pilot", "journalist", "electrician", "photographer", "accountant"]


def _date(rng: Random) -> str:
    return f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(2019, 2025)}"


def gen_extraction(rng: Random) -> str:
    kind = rng.randrange(6)
    name, other = rng.sample(NAMES, 2)
    if kind == 0:
        picks = rng.sample(ITEMS, rng.randint(2, 4))
        lines = "\n".join(f"- {rng.randint(1, 4)} x {item} at ${price:.2f}" for item, price in picks)
        text = (f"Order #{rng.randint(10000, 99999)} placed by {name} {rng.choice(['Silva', 'Okafor', 'Novak', 'Tanaka', 'Berg'])} on "
                f"{_date(rng)}.\nItems:\n{lines}\nShipping to: {rng.randint(1, 200)} {rng.choice(['Oak', 'Mill', 'River', 'Hill'])} "
                f"Street, {rng.choice(CITIES)}.")
        ask = rng.choice(["Extract the customer name, order date, items and total cost as JSON.",
                          "List every item with its quantity, and compute the order total.",
                          "What is the shipping city and how many items were ordered in total?"])
    elif kind == 1:
        a, b, c = rng.sample(NAMES, 3)
        text = (f"Meeting notes ({_date(rng)}): {a} will draft the budget by Friday. {b} agreed to contact the venue about "
                f"catering. The website update is delayed; {c} will check with the designer. Next meeting: "
                f"{rng.choice(['Monday', 'Tuesday', 'Wednesday'])} at {rng.randint(9, 16)}:00.")
        ask = rng.choice(["List each action item with its owner.", "Extract all people and their tasks as a table.",
                          "When is the next meeting, and who has the most urgent task?"])
    elif kind == 2:
        year = rng.randint(1950, 2000)
        text = (f"{name} {rng.choice(['Moreau', 'Lindqvist', 'Adeyemi', 'Kowalski', 'Herrera'])} was born in {year} in "
                f"{rng.choice(CITIES)}. After studying {rng.choice(['biology', 'law', 'music', 'engineering', 'economics'])}, "
                f"{name} worked as a {rng.choice(JOBS)} for {rng.randint(5, 25)} years before founding a small "
                f"{rng.choice(['publishing house', 'bakery', 'design studio', 'charity', 'software company'])}.")
        ask = rng.choice(["Extract the person's name, birth year, birthplace and occupation in JSON format.",
                          "How old would this person be in 2025? Show the fields you used.",
                          "Pull out every place and number mentioned in this text."])
    elif kind == 3:
        text = (f"Join us for the {rng.choice(['Spring', 'Summer', 'Harvest', 'Winter'])} {rng.choice(['Fair', 'Concert', 'Book Swap', 'Market'])} "
                f"on {_date(rng)} from {rng.randint(9, 12)} am to {rng.randint(2, 6)} pm at {rng.choice(['Riverside Park', 'the Town Hall', 'Elm Street Library', 'the Old Mill'])}. "
                f"Tickets cost ${rng.randint(3, 25)} for adults; children under {rng.randint(5, 12)} go free. Contact {name.lower()}@example.org for details.")
        ask = rng.choice(["What are the date, time and location of the event?", "Extract the event details as a JSON object.",
                          "Who should I contact, and how much would two adults and one small child pay?"])
    elif kind == 4:
        text = (f"Contacts: {name} - phone {rng.randint(200, 999)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}, "
                f"email {name.lower()}.{other.lower()}@example.com; {other} can be reached at {other.lower()}@example.net or "
                f"on {rng.randint(200, 999)}-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}.")
        ask = rng.choice(["Extract all email addresses.", "Extract every phone number and who it belongs to.",
                          "Turn this into a CSV with columns name, phone, email."])
    else:
        product = rng.choice([i for i, _ in ITEMS])
        stars = rng.randint(1, 5)
        text = (f"Review ({stars}/5): I bought the {product} last month. "
                f"{rng.choice(['It arrived quickly', 'Delivery took three weeks', 'The packaging was damaged'])}, and "
                f"{rng.choice(['the quality is excellent', 'it feels a bit cheap', 'it works as described'])}. "
                f"{rng.choice(['I would buy it again.', 'Not sure I would recommend it.', 'Great value for the price.'])}")
        ask = rng.choice(["Extract the product, the rating, and the pros and cons.", "Summarise this review as JSON with fields product, rating, sentiment."])
    return rng.choice([f"{ask}\n\n{text}", f"{text}\n\n{ask}"])


REVIEW_BITS_POS = ["absolutely loved it", "the staff were friendly", "worth every penny", "exceeded my expectations", "I'd recommend it to anyone"]
REVIEW_BITS_NEG = ["it broke after two days", "the service was slow", "overpriced for what you get", "really disappointing", "I asked for a refund"]
HEADLINES = ["Local team wins regional championship after dramatic final", "New study links daily walking to lower blood pressure",
             "Parliament debates changes to the tax code", "Startup unveils a phone battery that charges in five minutes",
             "City council approves budget for new parks", "Researchers train robot to fold laundry",
             "Star striker signs five-year contract", "Hospital opens new wing for children's care",
             "Election turnout reaches a twenty-year high", "Tech giant reports record quarterly profits"]


def gen_classification(rng: Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        k = rng.randint(1, 3)
        bits = rng.sample(REVIEW_BITS_POS, k) + rng.sample(REVIEW_BITS_NEG, rng.randint(0, 2) if k > 1 else rng.randint(1, 3))
        rng.shuffle(bits)
        review = "; ".join(bits)
        review = review[0].upper() + review[1:] + "."
        return f"Classify the sentiment of this review as positive, negative or mixed, and explain why:\n\n\"{review}\""
    if kind == 1:
        hs = rng.sample(HEADLINES, rng.randint(1, 4))
        listing = "\n".join(f"{i + 1}. {h}" for i, h in enumerate(hs))
        return f"Assign each headline to one category: sports, politics, technology, health, or local news.\n\n{listing}"
    spam = rng.random() < 0.5
    body = ("Congratulations!!! You have WON a $1,000 gift card. Click the link now to claim your prize before midnight."
            if spam else f"Hi {rng.choice(NAMES)}, just a reminder that our team lunch is moved to {rng.randint(11, 13)}:30 tomorrow. See you there!")
    return f"Is the following email spam or not spam? Answer and give a one-line reason.\n\n{body}"


# --------------------------------------------------------------------------------------------------------
# coding
# --------------------------------------------------------------------------------------------------------

PY_TASKS = [
    "checks whether a string is a palindrome, ignoring spaces and punctuation", "returns the n-th Fibonacci number iteratively",
    "merges two sorted lists into one sorted list", "flattens an arbitrarily nested list", "counts the vowels in a string",
    "removes duplicates from a list while keeping the original order", "returns the second largest number in a list",
    "checks whether two strings are anagrams", "converts a Roman numeral to an integer", "converts an integer to binary without using bin()",
    "finds all prime numbers below n using the Sieve of Eratosthenes", "computes the factorial of a number recursively",
    "groups a list of words by their first letter", "rotates a list by k positions", "validates an email address with a regular expression",
    "returns the most common word in a text", "transposes a matrix given as a list of lists", "checks whether parentheses in a string are balanced",
    "computes the running average of a list of numbers", "splits a list into chunks of size n", "capitalises the first letter of every word",
    "finds the longest word in a sentence", "computes the greatest common divisor of two numbers", "converts Celsius to Fahrenheit for a list of values",
    "sorts a list of dictionaries by a given key", "reads a CSV file and returns the average of one column",
    "counts how often each character appears in a string", "checks whether a year is a leap year", "performs binary search on a sorted list",
    "returns all permutations of a short string", "computes the dot product of two vectors", "formats a number of seconds as HH:MM:SS",
]
PY_OTHER = [
    "Write a Python class representing a bank account with deposit, withdraw and balance methods.",
    "Write a Python decorator that measures how long a function takes to run.",
    "Write a Python script that prints the ten largest files in a directory.",
    "Implement a stack class in Python with push, pop and peek.",
    "Implement a simple LRU cache in Python without using functools.",
    "Write a Python generator that yields the lines of a file that contain a given word.",
    "Write a small command-line to-do list program in Python that stores tasks in a JSON file.",
    "Show me how to use list comprehensions in Python with three examples of increasing difficulty.",
    "Explain the difference between a list and a generator in Python, with code.",
    "How do I handle exceptions in Python? Show an example with try, except, else and finally.",
    "Write a Python function that fetches a web page with the requests library and returns its title.",
    "Write unit tests with pytest for a function add(a, b).",
    "Write a Python dataclass for a book with title, author and year, and sort a list of books by year.",
    "Explain what *args and **kwargs mean in Python, with examples.",
    "Write a Python script that renames all .txt files in a folder by adding today's date to their names.",
]
PY_BUGGY = [
    "def average(numbers):\n    total = 0\n    for n in numbers:\n        total += n\n    return total / len(numbers) - 1",
    "def find_max(values):\n    best = 0\n    for v in values:\n        if v > best:\n            best = v\n    return best",
    "def count_words(text):\n    counts = {}\n    for word in text.split():\n        counts[word] += 1\n    return counts",
    "def reverse(s):\n    result = ''\n    for i in range(len(s)):\n        result += s[len(s) - i]\n    return result",
    "def is_even(n):\n    if n % 2 == 1:\n        return True\n    return False",
    "def append_item(item, items=[]):\n    items.append(item)\n    return items",
]
PY_EXPLAIN = [
    "squares = {x: x * x for x in range(10) if x % 2 == 0}",
    "from collections import Counter\nprint(Counter('mississippi').most_common(2))",
    "def memo(f):\n    cache = {}\n    def wrapper(n):\n        if n not in cache:\n            cache[n] = f(n)\n        return cache[n]\n    return wrapper",
    "pairs = list(zip(names, ages))\npairs.sort(key=lambda p: p[1], reverse=True)",
    "with open('log.txt') as f:\n    errors = [line for line in f if 'ERROR' in line]",
]


def gen_python(rng: Random) -> str:
    r = rng.random()
    if r < 0.5:
        t = rng.choice(PY_TASKS)
        return rng.choice([f"Write a Python function that {t}.", f"Implement a Python function that {t}. Include a docstring.",
                           f"In Python, how would I write a function that {t}? Show an example call.",
                           f"Write a Python function that {t}, and explain its time complexity."])
    if r < 0.75:
        return rng.choice(PY_OTHER)
    if r < 0.9:
        code = rng.choice(PY_BUGGY)
        return rng.choice([f"Find and fix the bug in this Python code:\n\n```python\n{code}\n```",
                           f"This function gives wrong results. What's wrong?\n\n```python\n{code}\n```"])
    code = rng.choice(PY_EXPLAIN)
    return rng.choice([f"Explain what this Python code does:\n\n```python\n{code}\n```",
                       f"Walk me through this code line by line:\n\n```python\n{code}\n```"])


JS_TASKS = [
    "Write a JavaScript function that debounces another function.", "Write a JavaScript function that deep-clones an object.",
    "Show how to fetch JSON from an API in JavaScript using async/await, with error handling.",
    "Write JavaScript that adds a new item to an unordered list when a button is clicked.",
    "Write a JavaScript function that removes duplicate values from an array.", "Explain the difference between let, const and var in JavaScript.",
    "Explain JavaScript promises with a simple example.", "Write a JavaScript function that checks whether a number is prime.",
    "How do I sort an array of objects by a property in JavaScript?", "Write a JavaScript function that capitalises each word in a sentence.",
    "Explain what closures are in JavaScript and give an example.", "Write a JavaScript countdown timer that updates a page element every second.",
    "Write a JavaScript function that groups an array of objects by a key.", "What does the 'this' keyword refer to in JavaScript? Give examples.",
    "Write a small Express.js server with one GET endpoint that returns the current time.",
    "Explain the difference between == and === in JavaScript.", "Write a JavaScript function to validate a form with name and email fields.",
    "How do I store and read data in localStorage in JavaScript?", "Write a JavaScript function that returns the frequency of each word in a string.",
    "Convert this loop to use Array.map: let out = []; for (let i = 0; i < nums.length; i++) { out.push(nums[i] * 2); }",
    "Explain the JavaScript event loop in simple terms.", "Write a JavaScript function that flattens a nested array without using flat().",
    "Write a TypeScript interface for a user with id, name, optional email and a list of roles.",
    "Write a JavaScript function that throttles calls to at most once per second.",
]
SQL_SCHEMAS = [
    "employees(id, name, department, salary, hire_date)",
    "orders(id, customer_id, order_date, total) and customers(id, name, country)",
    "students(id, name, grade) and enrollments(student_id, course_id, score) and courses(id, title)",
    "products(id, name, category, price, stock)",
    "books(id, title, author_id, published_year) and authors(id, name, country)",
]
SQL_QUESTIONS = {
    0: ["find the three highest-paid employees", "compute the average salary per department", "list employees hired in the last two years",
        "find departments with more than ten employees", "find employees who earn more than their department's average"],
    1: ["find the total amount spent by each customer", "list customers who have never placed an order", "count orders per country",
        "find the month with the highest revenue", "find each customer's most recent order"],
    2: ["find the average score per course", "list students enrolled in more than three courses", "find the top student in each course",
        "count how many students take each course"],
    3: ["list products that are out of stock", "find the most expensive product in each category", "compute the total stock value",
        "increase the price of all products in one category by 10 percent"],
    4: ["count books per author", "list authors with no books published after 2000", "find the author with the most books",
        "list books together with their author's name, newest first"],
}


def gen_js(rng: Random) -> str:
    if rng.random() < 0.45:
        t = rng.choice([t for t in PY_TASKS if "CSV" not in t and "bin()" not in t])
        return rng.choice([f"Write a JavaScript function that {t}.", f"In JavaScript (ES6), write a function that {t}.",
                           f"Write a TypeScript function that {t}, with type annotations."])
    return rng.choice(JS_TASKS)


def gen_sql(rng: Random) -> str:
    if rng.random() < 0.15:
        return rng.choice(["Explain the difference between INNER JOIN and LEFT JOIN with an example.",
                           "What is a database index, and when should I add one?", "Explain GROUP BY and HAVING with an example.",
                           "What is database normalisation? Explain the first three normal forms.",
                           "Explain what a SQL transaction is and why it matters."])
    i = rng.randrange(len(SQL_SCHEMAS))
    q = rng.choice(SQL_QUESTIONS[i])
    return rng.choice([f"Given the tables {SQL_SCHEMAS[i]}, write a SQL query to {q}.",
                       f"I have a database with {SQL_SCHEMAS[i]}. How do I {q} in SQL?",
                       f"Write SQL to {q}. Schema: {SQL_SCHEMAS[i]}."])


# --------------------------------------------------------------------------------------------------------
# maths / logic
# --------------------------------------------------------------------------------------------------------


def gen_math(rng: Random) -> str:
    n1, n2 = rng.sample(NAMES, 2)
    k = rng.randrange(16)
    if k == 0:
        a, b, x, y = rng.randint(1, 5), rng.randint(2, 9), rng.randint(2, 12), rng.randint(1, 6)
        q = f"Pencils cost ${a} each and notebooks cost ${b} each. {n1} buys {x} pencils and {y} notebooks. How much does {n1} spend?"
    elif k == 1:
        h = rng.randint(2, 6)
        v = rng.choice([45, 60, 72, 80, 90, 110])
        q = f"A train travels {v * h} km in {h} hours. What is its average speed, and how long would it take to travel {v * rng.randint(2, 9)} km at that speed?"
    elif k == 2:
        q = f"What is {rng.choice([5, 12, 15, 20, 35, 40, 75])}% of {rng.randint(20, 2000)}?"
    elif k == 3:
        q = (f"If you invest ${rng.choice([500, 1000, 2500, 10000])} at {rng.choice([2, 3, 4, 5, 6])}% annual interest compounded yearly, "
             f"how much will you have after {rng.randint(2, 10)} years?")
    elif k == 4:
        w, d = rng.randint(3, 15), rng.randint(1, 8)
        q = f"A rectangle's length is {d} cm more than its width, and its perimeter is {2 * (2 * w + d)} cm. What is its area?"
    elif k == 5:
        a, x, b = rng.randint(2, 9), rng.randint(-10, 15), rng.randint(-20, 20)
        q = f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {a * x + b}."
    elif k == 6:
        w1, d = rng.choice([(2, 12), (3, 10), (4, 9), (5, 6), (6, 8)])
        q = f"{w1} workers can paint a house in {d} days. How long would {rng.choice([w for w in (2, 3, 4, 6, 8, 12) if w != w1])} workers take, working at the same rate?"
    elif k == 7:
        s, g = rng.choice([2, 4, 6]), rng.choice([200, 250, 300, 450])
        q = f"A recipe for {s} people needs {g} grams of flour. How much flour do I need for {rng.choice([3, 5, 9, 10, 15])} people?"
    elif k == 8:
        cnt, avg = rng.randint(4, 9), rng.randint(10, 60)
        q = f"The average of {cnt} numbers is {avg}. If the number {rng.randint(1, 90)} is removed, what is the average of the remaining numbers?"
    elif k == 9:
        q = f"What is the sum of all whole numbers from 1 to {rng.choice([50, 100, 200, 500, 1000])}? Explain the shortcut."
    elif k == 10:
        r, b, g = rng.randint(2, 8), rng.randint(2, 8), rng.randint(1, 6)
        q = f"A bag contains {r} red, {b} blue and {g} green marbles. If I draw two marbles without replacement, what is the probability that both are red?"
    elif k == 11:
        q = f"Convert {rng.choice([32, 50, 68, 77, 98, 104, 212, -4])} degrees Fahrenheit to Celsius and show the formula."
    elif k == 12:
        d = rng.randint(2, 12)
        s = 2 * rng.randint(15, 40) + d
        q = f"The sum of {n1}'s and {n2}'s ages is {s}, and {n1} is {d} years older. How old is each of them?"
    elif k == 13:
        a, b = rng.randint(12, 300), rng.randint(12, 300)
        q = rng.choice([f"What is {a} times {b}?", f"What is the greatest common divisor of {a} and {b}?",
                        f"What is the least common multiple of {a} and {b}?", f"Is {rng.randint(50, 500)} a prime number? Explain how you checked."])
    elif k == 14:
        p, v = rng.choice([10, 15, 20]), rng.choice([12000, 18000, 25000, 30000])
        q = f"A car worth ${v} loses {p}% of its value every year. What is it worth after {rng.randint(2, 5)} years?"
    else:
        price, disc = rng.choice([40, 60, 80, 120, 250]), rng.choice([10, 20, 25, 30])
        q = f"A jacket costs ${price}. It is discounted by {disc}%, and then a {rng.choice([5, 8, 10])}% sales tax is added. What is the final price?"
    return q + rng.choice(["", "", " Show your work.", " Explain step by step.", " Give just the answer and one line of reasoning."])


DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CATS = [("cats", "mammals", "pets"), ("roses", "flowers", "red things"), ("squares", "rectangles", "shapes with four equal sides"),
        ("sparrows", "birds", "animals that can fly"), ("violins", "instruments", "things made of wood"),
        ("teachers", "adults", "people who like chess"), ("apples", "fruits", "sweet foods")]
COMMONSENSE = [
    "If I put a metal spoon in a microwave and turn it on, what might happen and why?",
    "Why might someone carry an umbrella on a sunny day?", "Why do people usually whisper in libraries?",
    "If a glass of water is left outside on a freezing night, what happens to the glass and why?",
    "Why is it harder to walk on sand than on a pavement?", "A candle is lit in a closed jar. What happens after a while, and why?",
    "Why do we see lightning before we hear thunder?", "Why does a helium balloon rise but a normal balloon sinks?",
    "If you drop a feather and a hammer on the Moon, which lands first?",
    "Why might a restaurant be empty at 7 pm on a Saturday? Give several possible reasons.",
    "A plant on a windowsill leans toward the window. Why?", "Why do shops often put milk at the back of the store?",
    "If all the clocks in a house show different times, how could you find the right time without a phone?",
    "A car won't start on a cold morning, but the lights work. What could be the problem?",
    "Why does bread go stale faster in the fridge than on the counter?",
]


def gen_logic(rng: Random) -> str:
    k = rng.randrange(8)
    if k == 0:
        people = rng.sample(NAMES, rng.randint(3, 5))
        adj = rng.choice([("taller", "shortest"), ("older", "youngest"), ("faster", "slowest"), ("richer", "poorest")])
        facts = " ".join(f"{a} is {adj[0]} than {b}." for a, b in zip(people, people[1:]))
        order = facts.split(". ")
        rng.shuffle(order)
        facts = ". ".join(s.rstrip(".") for s in order) + "."
        return f"{facts} Who is the {adj[1]}? Explain your reasoning."
    if k == 1:
        x, y, z = rng.choice(CATS)
        return rng.choice([f"All {x} are {y}. Some {y} are {z}. Does it follow that some {x} are {z}? Explain.",
                           f"If all {x} are {y}, and no {y[:-1] if y.endswith('s') else y} is invisible, can any {x} be invisible? Explain."])
    if k == 2:
        if rng.random() < 0.5:
            a, d = rng.randint(1, 20), rng.randint(2, 9)
            seq = [a + d * i for i in range(5)]
        else:
            a, r = rng.randint(1, 5), rng.randint(2, 4)
            seq = [a * r ** i for i in range(5)]
        return f"What number comes next in the sequence {', '.join(map(str, seq))}, ...? Explain the pattern."
    if k == 3:
        return f"If today is {rng.choice(DAYS)}, what day of the week will it be in {rng.randint(3, 400)} days?"
    if k == 4:
        return f"What is the angle between the hour and minute hands of a clock at {rng.randint(1, 12)}:{rng.choice(['00', '15', '20', '30', '45'])}?"
    if k == 5:
        a, b = rng.sample(NAMES, 2)
        return (f"{a} and {b} each have some coins. If {a} gives {b} {rng.randint(1, 5)} coins, they have the same number. "
                f"Together they have {2 * rng.randint(10, 30)} coins. How many does each have?")
    if k == 6:
        return rng.choice(COMMONSENSE)
    n = rng.randint(3, 6)
    colors = rng.sample(["red", "blue", "green", "yellow", "white", "black"], n)
    return (f"There are {n} boxes labelled {', '.join(colors)}. Exactly one holds a prize. The {colors[0]} box is not it, "
            f"and the prize is in a box whose name has {len(colors[1])} letters. Which boxes could hold the prize?")


# --------------------------------------------------------------------------------------------------------
# trivia / role-play / chit-chat
# --------------------------------------------------------------------------------------------------------

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


GENERATORS = {
    "explain": gen_explain, "howto": gen_howto, "story": gen_story, "poem": gen_poem, "email_letter": gen_email,
    "summarize": gen_summarize, "rewrite": gen_rewrite, "brainstorm": gen_brainstorm, "compare": gen_compare,
    "advice": gen_advice, "coding_python": gen_python, "coding_js": gen_js, "coding_sql": gen_sql, "math": gen_math,
    "logic": gen_logic, "trivia": gen_trivia, "roleplay": gen_roleplay, "extraction": gen_extraction,
    "classification": gen_classification, "chitchat": gen_chitchat, "stem": gen_stem, "opinion": gen_opinion,
}


# --------------------------------------------------------------------------------------------------------
# build + contamination check
# --------------------------------------------------------------------------------------------------------


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--bench", type=Path, default=MT_BENCH_QUESTIONS, help="MT-Bench JSONL to check against")
    args = parser.parse_args(argv)

    prompts = build(args.seed)
    if args.bench.is_file():
        check = Decontaminator([args.bench])
        hits = [(p["id"], check.shared({"prompt": p["turns"][0]})) for p in prompts]
        hits = [(pid, " ".join(shared)) for pid, shared in hits if shared]
        print(f"contamination check vs {args.bench}: {len(hits)} prompt(s) share a run of >= {OVERLAP_WORDS} words")
        for pid, shared in hits[:20]:
            print(f"  {pid}: ...{shared}...")
        if hits:
            return 1
    else:
        print(f"contamination check skipped: {args.bench} not found", file=sys.stderr)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as handle:
        for p in prompts:
            handle.write(json.dumps(p, ensure_ascii=False) + "\n")

    counts = collections.Counter(p["category"] for p in prompts)
    lengths = [len(words(p["turns"][0])) for p in prompts]
    print(f"wrote {len(prompts)} prompts to {args.output}")
    print(f"words per prompt: mean {statistics.mean(lengths):.1f}, median {statistics.median(lengths)}, "
          f"min {min(lengths)}, max {max(lengths)}")
    for category, n in sorted(counts.items()):
        cl = [len(words(p["turns"][0])) for p in prompts if p["category"] == category]
        print(f"  {category:15s} {n:4d}  mean words {statistics.mean(cl):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
