"""Prompt generators over short passages: summarise / rewrite / extraction / classification.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

from .words import CITIES, NAMES

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
