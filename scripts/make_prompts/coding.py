"""Prompt generators: coding (Python, JavaScript, SQL).

Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

from random import Random

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
