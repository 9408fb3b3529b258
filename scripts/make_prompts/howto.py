"""Prompt generators: how-to / advice / opinion / brainstorm / compare.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

from .words import maybe_suffix

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
