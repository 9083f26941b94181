"""Training prompts this project generates itself, deterministic from a seed (no public datasets).

Four families: arithmetic word problems, small coding tasks, general questions, multi-turn chats.
Each prompt is a list of chat messages; `split_of` assigns a fixed train / held-out split by hash
of the conversation text (about 5% held out), so the split never depends on the seed or count.
"""

from __future__ import annotations

import hashlib
import json
import random

NAMES = [
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kemi",
    "Liam",
    "Maya",
    "Nikolai",
    "Olga",
    "Priya",
    "Quentin",
    "Rosa",
    "Sami",
    "Tariq",
    "Uma",
    "Victor",
    "Wen",
    "Yara",
]
ITEMS = ["apples", "marbles", "books", "stickers", "pencils", "cookies", "stamps", "coins", "shells", "cards"]
PLACES = ["market", "school fair", "library sale", "bakery", "toy shop", "garden center"]
TOPICS = [
    "photosynthesis",
    "the water cycle",
    "how vaccines work",
    "black holes",
    "the French Revolution",
    "plate tectonics",
    "how a bicycle stays upright",
    "compound interest",
    "the immune system",
    "why the sky is blue",
    "how bread rises",
    "the history of the printing press",
    "volcanoes",
    "how airplanes fly",
    "recycling",
    "the solar system",
    "climate and weather",
    "electric circuits",
    "the human heart",
    "ancient Rome",
    "the internet",
    "honeybees",
    "tides",
    "rainbows",
    "glaciers",
    "how batteries work",
    "the Renaissance",
    "coral reefs",
    "earthquakes",
    "the moon's phases",
    "machine learning",
    "prime numbers",
    "democracy",
    "the stock market",
    "sleep",
    "healthy eating",
]
ASKS = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t} for a ten-year-old.",
    "Why is {t} important?",
    "Give me a brief overview of {t}.",
    "Summarize the key ideas of {t} in a few sentences.",
    "What is a common misconception about {t}?",
    "How would you teach {t} to a beginner?",
]
STYLE = ["", "", " Keep it brief.", " Use a numbered list.", " Use a friendly tone.", " Answer in two paragraphs."]
GENERAL = [
    "Give me {n} tips for {a}.",
    "Write a short poem about {b}.",
    "Suggest {n} names for a {c}.",
    "Write a polite email asking {p} to {d}.",
    "What should I pack for a trip to {e}?",
    "Describe a {b} in {n} sentences.",
    "List {n} ideas for a weekend with {f}.",
]
ACTIVITIES = [
    "studying for exams",
    "staying focused",
    "learning to cook",
    "saving money",
    "running a 5k",
    "keeping a plant alive",
    "writing a resume",
    "learning a language",
    "public speaking",
]
THINGS = ["the ocean", "autumn", "a rainy day", "the city at night", "a mountain", "friendship", "a cat"]
KINDS = ["coffee shop", "pet goldfish", "robot", "sailing boat", "bakery", "podcast", "board game"]
PEOPLE = ["my manager", "a professor", "my landlord", "a colleague", "the school principal"]
ACTIONS = ["reschedule our meeting", "extend a deadline", "fix the heating", "review my draft"]
DESTS = ["the beach", "the mountains", "Paris in winter", "a rainforest", "a desert", "Tokyo"]
COMPANY = ["friends", "family", "kids", "a dog", "no plans"]
FUNCS = [
    "returns the sum of the even numbers in a list",
    "reverses a string",
    "checks whether a string is a palindrome",
    "returns the n-th Fibonacci number",
    "counts the vowels in a string",
    "returns the largest element of a list without using max",
    "removes duplicates from a list while keeping order",
    "checks whether a number is prime",
    "computes the factorial of n",
    "merges two sorted lists into one sorted list",
    "returns the word frequencies of a sentence as a dict",
    "flattens a nested list",
    "converts Celsius to Fahrenheit",
    "returns the second smallest number in a list",
    "capitalizes the first letter of every word",
    "computes the average of a list of numbers",
    "finds the greatest common divisor of two integers",
    "checks if two strings are anagrams",
    "returns all prime numbers below n",
    "counts the lines in a text file",
    "sorts a list of dictionaries by the key '{k}'",
    "returns the index of '{k}' in a list or -1",
    "splits a list into chunks of size {n}",
    "rotates a list by {n} positions",
    "returns the digits of an integer as a list",
    "validates that a string looks like an email",
]
LANGS = ["Python", "Python", "Python", "JavaScript", "C"]
CODE_ASKS = [
    "Write a {l} function that {f}.",
    "Write a {l} function that {f}. Include a short docstring.",
    "How do I write a {l} function that {f}?",
    "Write a {l} function that {f}, and explain it briefly.",
]
CODE_EXTRAS = [
    "",
    "",
    " Use a loop.",
    " Add type hints.",
    " Show an example call.",
    " Keep it short.",
    " Handle the empty input case.",
]
KEYS = ["name", "age", "price", "score", "id"]
FOLLOW_UPS = [
    "Can you explain that in more detail?",
    "Can you make it shorter?",
    "Why is that?",
    "Can you give an example?",
    "What would change if the numbers were doubled?",
    "Thanks! Can you summarize it in one sentence?",
    "Is there another way to do it?",
]


def arithmetic(r: random.Random) -> tuple[str, str]:
    a, b, c = r.randint(2, 60), r.randint(2, 40), r.randint(2, 9)
    n1, n2 = r.sample(NAMES, 2)
    it, pl = r.choice(ITEMS), r.choice(PLACES)
    kind = r.randrange(5)
    if kind == 0:
        q, ans = f"{n1} has {a} {it}. {n2} gives {n1} {b} more. How many {it} does {n1} have now?", a + b
    elif kind == 1:
        q, ans = (
            (f"{n1} buys {c} bags of {it} at the {pl}. Each bag has {b} {it}. How many {it} does {n1} have in total?"),
            c * b,
        )
    elif kind == 2:
        a = max(a, b + 1)
        q, ans = f"{n1} had {a} {it} and gave {b} to {n2}. How many {it} are left?", a - b
    elif kind == 3:
        price = r.randint(2, 15)
        q = f"At the {pl}, {it} cost ${price} each. {n1} buys {c} and {n2} buys {b}. How much do they spend together?"
        ans = price * (c + b)
    else:
        tot = c * b
        q, ans = (
            (f"{n1} shares {tot} {it} equally among {c} friends. How many {it} does each friend get? Show your steps."),
            b,
        )
    return q, f"The answer is {ans}."


def coding(r: random.Random) -> tuple[str, str]:
    f = r.choice(FUNCS).format(k=r.choice(KEYS), n=r.randint(2, 5))
    q = r.choice(CODE_ASKS).format(l=r.choice(LANGS), f=f) + r.choice(CODE_EXTRAS)
    return q, "Here is one way to write it."


def general(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.55:
        q = r.choice(ASKS).format(t=r.choice(TOPICS)) + r.choice(STYLE)
    else:
        q = r.choice(GENERAL).format(
            n=r.randint(3, 5),
            a=r.choice(ACTIVITIES),
            b=r.choice(THINGS),
            c=r.choice(KINDS),
            p=r.choice(PEOPLE),
            d=r.choice(ACTIONS),
            e=r.choice(DESTS),
            f=r.choice(COMPANY),
        )
    return q, "Sure, here is a short answer."


FAMILIES = {"arithmetic": arithmetic, "coding": coding, "general": general}


def make_prompt(r: random.Random) -> dict:
    """One prompt: {"family": str, "messages": [{"role", "content"}, ...]} ending with a user turn."""
    x = r.random()
    if x < 0.75:
        fam = r.choice(list(FAMILIES))
        q, _ = FAMILIES[fam](r)
        return {"family": fam, "messages": [{"role": "user", "content": q}]}
    turns = r.randint(2, 3)
    msgs = []
    for t in range(turns - 1):  # earlier turns: a question plus a short templated reply
        q, reply = FAMILIES[r.choice(list(FAMILIES))](r)
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": reply}]
    if r.random() < 0.5:
        msgs.append({"role": "user", "content": r.choice(FOLLOW_UPS)})
    else:
        msgs.append({"role": "user", "content": FAMILIES[r.choice(list(FAMILIES))](r)[0]})
    return {"family": "chat", "messages": msgs}


def split_of(messages: list[dict], heldout_pct: int = 5) -> str:
    """'heldout' for about heldout_pct% of conversations (by content hash), else 'train'."""
    h = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).digest()
    return "heldout" if int.from_bytes(h[:4], "big") % 100 < heldout_pct else "train"


def generate(n: int, seed: int = 0) -> list[dict]:
    """n distinct prompts with ids 'p{i}' and their split; the same (n, seed) gives the same list,
    and a larger n extends a smaller one (prompt i depends on seed and i only)."""
    out, seen, i = [], set(), 0
    while len(out) < n:
        r = random.Random(f"{seed}-{i}")
        i += 1
        p = make_prompt(r)
        key = json.dumps(p["messages"], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        out.append({"id": f"p{len(out)}", **p, "split": split_of(p["messages"])})
    return out
