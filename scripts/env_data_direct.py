"""The direct half of ``make_env_data.py``: questions a model answers from the prompt alone (small
arithmetic, facts stated in the question), so the router's ANSWER route is the right one there."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

NAMES = (
    "Mira Tomas Lena Omar Priya Jonas Aiko Felix Nadia Ravi Sofia Emil Hana Luca Zara Ivan "
    "Maya Theo Alma Kofi Ines Yusuf Clara Pavel"
).split()
RELATIVES = ("brother", "sister", "cousin", "friend", "neighbour")
ITEMS = ("marbles", "apples", "stickers", "pencils", "coins", "stamps", "shells", "cards")
PETS = ("cat", "dog", "parrot", "rabbit", "goldfish", "tortoise")
COLOURS = ("teal", "amber", "crimson", "olive", "violet", "silver", "indigo", "coral")
OBJECTS = ("red umbrella", "spare key", "blue notebook", "old lantern", "wooden box", "map")
PLACES = ("kitchen", "garden shed", "attic", "hallway", "garage", "library", "cellar", "porch")
SYLLABLES = "al bor cen dra el fir gon hal ir jun kor lem mav nor ost pel quar rud sil tav".split()
COUNTRY_ENDS = ("ia", "land", "stan", "ora", "esh")
CITY_ENDS = ("grad", "port", "ton", "ville", "burg", "ora")


def row(question: str, answer: str, kind: str) -> dict[str, Any]:
    return {
        "data_source": "direct",
        "prompt": [{"role": "user", "content": question}],
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"task_type": "direct", "kind": kind},
    }


def arithmetic(r: random.Random) -> tuple[str, str]:
    """One operation on 1- or 2-digit numbers."""
    op = r.randrange(4)
    if op == 0:
        a, b = r.randint(1, 99), r.randint(1, 99)
        return r.choice([f"What is {a} + {b}?", f"Add {a} and {b}."]), str(a + b)
    if op == 1:
        a, b = sorted((r.randint(1, 99), r.randint(1, 99)), reverse=True)
        return r.choice([f"What is {a} - {b}?", f"Subtract {b} from {a}."]), str(a - b)
    if op == 2:
        a, b = r.randint(2, 12), r.randint(2, 12)
        return r.choice([f"What is {a} * {b}?", f"What is {a} times {b}?"]), str(a * b)
    b, k = r.randint(2, 9), r.randint(2, 11)
    return f"What is {b * k} divided by {b}?", str(k)


def age(r: random.Random) -> tuple[str, str]:
    name, rel = r.choice(NAMES), r.choice(RELATIVES)
    years, diff = r.randint(12, 80), r.randint(1, 9)
    older = r.random() < 0.5
    word = "older" if older else "younger"
    q = (
        f"{name} is {years} years old and {name}'s {rel} is {diff} years {word}. "
        f"How old is {name}'s {rel}?"
    )
    return q, str(years + diff if older else years - diff)


def counting(r: random.Random) -> tuple[str, str]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    have, change = r.randint(5, 40), r.randint(1, 9)
    if r.random() < 0.5:
        q = f"{name} has {have} {item} and gets {change} more. "
        return q + f"How many {item} does {name} have now?", str(have + change)
    q = f"{name} has {have} {item} and gives away {change}. "
    return q + f"How many {item} does {name} have left?", str(have - change)


def _word(r: random.Random, ends: tuple[str, ...]) -> str:
    return ("".join(r.choice(SYLLABLES) for _ in range(2)) + r.choice(ends)).capitalize()


def capital(r: random.Random) -> tuple[str, str]:
    country, city = _word(r, COUNTRY_ENDS), _word(r, CITY_ENDS)
    q = (
        f"The capital of the fictional country of {country} is {city}. "
        f"What is the capital of {country}?"
    )
    return q, city


def stated_fact(r: random.Random) -> tuple[str, str]:
    name = r.choice(NAMES)
    if r.random() < 0.5:
        pet, colour, pet_name = r.choice(PETS), r.choice(COLOURS), _word(r, ("o", "i", "y"))
        q = (
            f"{name}'s favourite colour is {colour} and {name}'s {pet} is called {pet_name}. "
            f"What is the name of {name}'s {pet}?"
        )
        return q, pet_name
    thing, place = r.choice(OBJECTS), r.choice(PLACES)
    q = f"{name} left the {thing} in the {place}. Where did {name} leave the {thing}?"
    return q, f"the {place}"


KINDS: list[tuple[str, Callable[[random.Random], tuple[str, str]]]] = [
    ("arithmetic", arithmetic),
    ("age", age),
    ("counting", counting),
    ("capital", capital),
    ("stated_fact", stated_fact),
]


def direct_rows(seed: int, total: int) -> list[dict[str, Any]]:
    """``total`` distinct questions, the kinds in turn."""
    r = random.Random(f"direct-{seed}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < total:
        name, make = KINDS[len(rows) % len(KINDS)]
        q, ans = make(r)
        key = q.split(". ")[0] if name == "capital" else q  # one capital per country
        if key in seen:
            continue
        seen.add(key)
        rows.append(row(q, ans, name))
    return rows
