"""Prompt generators: maths / logic.

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

from .words import NAMES

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
