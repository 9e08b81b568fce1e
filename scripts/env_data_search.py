"""The search half of ``make_env_data.py``: a seeded fictional world (towns, people, companies,
rivers) written as a corpus, with 1- and 2-hop questions whose answers are in it."""

from __future__ import annotations

import random
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from toolgrpo.envs.search import normalize_answer

N_TRAIN, N_TEST = 400, 100  # rows per split, for both task types


def row(task_type: str, question: str, answer: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "data_source": task_type,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math" if task_type == "calculator" else "retrieval",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"task_type": task_type, **extra},
    }


# ---- search: a fictional world ------------------------------------------------------------------
SYLLABLES = (
    "ba bre cal dar el fen gal hor il jas kel lor mar nel or pra quin ros sel tar ul ve wil yar "
    "zen thal cor dun esk mir nov ost pell rav sor tiv urd vash bel cren dol fa grim hes ith lum "
    "mog nar ob pim quor rin sav tem ub vor wen"
).split()
TOWN_ENDS = "mere ford holt wick stead haven dale bury moor crest fall reach".split()
FIRST_ENDS = "a o in eth is an elle ric wyn".split()
LAST_ENDS = "son by ley wick ard ell ton more".split()
INDUSTRIES = {  # name suffix: (industry, products)
    "Textiles": ("textile", ["woollen blankets", "linen sailcloth", "dyed silk scarves"]),
    "Ironworks": ("steel", ["cast iron stoves", "railway bridges", "copper kettles"]),
    "Mills": ("milling", ["rye flour", "oat biscuits", "barley malt"]),
    "Instruments": ("instrument", ["brass telescopes", "ship compasses", "pocket barometers"]),
    "Shipping": ("shipping", ["river barges", "ferry lines", "cargo lighters"]),
    "Glassworks": ("glass", ["stained glass windows", "green bottles", "lamp chimneys"]),
    "Foods": ("food", ["smoked trout", "plum preserves", "goat cheese"]),
    "Electric": ("electrical", ["dynamo lamps", "telegraph cables", "water turbines"]),
}
SPECIALTIES = "salt trade|glassblowing|kite festival|cherry orchards|horse fair".split("|")
JOBS = "engineer architect merchant physician teacher chemist lawyer botanist painter".split()
HOBBIES = "old maps|pressed ferns|tin soldiers|sea shells|clockwork toys|stamps".split("|")
DIRECTIONS = "north south east west centre uplands".split()


class Names:
    """Invented words, each used once in the whole world so every question names one entity."""

    def __init__(self, r: random.Random) -> None:
        self.r, self.used = r, set()

    def new(self, parts: int, ends: list[str] | None = None) -> str:
        while True:
            w = "".join(self.r.choice(SYLLABLES) for _ in range(parts))
            w += self.r.choice(ends) if ends else ""
            if w not in self.used and 4 <= len(w) <= 12:
                self.used.add(w)
                return w.capitalize()


@dataclass(eq=False)
class Entity:
    """One document's subject; ``facts`` fill its text template and its questions."""

    kind: str
    name: str
    facts: dict[str, Any]
    id: str = ""

    def __getattr__(self, key: str) -> Any:
        try:
            return self.__dict__["facts"][key]
        except KeyError:
            raise AttributeError(key) from None


TEXTS = {
    "province": "{e.name} is a province in the {e.direction} of the Republic of Ardenvale. Its "
    "capital is {e.capital.name}. Other towns in {e.name} include {e.others}.",
    "river": "The {e.name} River is {e.length} kilometres long. It rises in the {e.hills} Hills "
    "and empties into Lake {e.lake}.",
    "town": "{e.name} is a town in the province of {e.province.name}, on the {e.river.name} River. "
    "It was founded in {e.founded} and has a population of {e.pop:,}. The mayor of {e.name} is "
    "{e.mayor.name}. The town is known for its {e.special}.",
    "person": "{e.name} is {e.a_job} born in {e.home.name} in {e.born}.{e.roles} In spare time, "
    "{e.last} collects {e.hobby}.",
    "company": "{e.name} is {e.a_industry} company headquartered in {e.hq.name}. It was founded in "
    "{e.founded} by {e.founder.name}. {e.name} is best known for its {e.product} and employs "
    "about {e.staff:,} people.",
}
# (question, answer) templates per kind; ``e`` is the entity the question names.
ONE_HOP = {
    "town": [
        ("In which year was {e.name} founded?", "{e.founded}"),
        ("What is the population of {e.name}?", "{e.pop:,}"),
        ("Who is the mayor of {e.name}?", "{e.mayor.name}"),
        ("On which river is the town of {e.name}?", "{e.river.name} River"),
        ("In which province is {e.name}?", "{e.province.name}"),
    ],
    "person": [
        ("In which town was {e.name} born?", "{e.home.name}"),
        ("In which year was {e.name} born?", "{e.born}"),
        ("What is the occupation of {e.name}?", "{e.job}"),
    ],
    "company": [
        ("In which year was {e.name} founded?", "{e.founded}"),
        ("Who founded {e.name}?", "{e.founder.name}"),
        ("In which town is {e.name} headquartered?", "{e.hq.name}"),
        ("What is {e.name} best known for?", "{e.product}"),
    ],
    "river": [
        ("How long is the {e.name} River, in kilometres?", "{e.length}"),
        ("Into which lake does the {e.name} River flow?", "Lake {e.lake}"),
        ("In which hills does the {e.name} River rise?", "{e.hills} Hills"),
    ],
}
# (question, answer, bridge): the answer is in the document of the entity named by ``bridge``.
TWO_HOP = {
    "town": [
        (
            "What is the length, in km, of the river that flows through {e.name}?",
            "{e.river.length}",
            "river",
        ),
        (
            "Into which lake does the river that flows through {e.name} empty?",
            "Lake {e.river.lake}",
            "river",
        ),
        (
            "In which year was the company founded by the mayor of {e.name} established?",
            "{e.mayor.company.founded}",
            "mayor.company",
        ),
    ],
    "person": [
        ("Who is the mayor of the town where {e.name} was born?", "{e.home.mayor.name}", "home"),
        (
            "In which province is the town where {e.name} was born?",
            "{e.home.province.name}",
            "home",
        ),
    ],
    "company": [
        (
            "What is the population of the town where {e.name} is headquartered?",
            "{e.hq.pop:,}",
            "hq",
        ),
        ("In which year was the founder of {e.name} born?", "{e.founder.born}", "founder"),
    ],
}


def search_world(seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The corpus rows and the question rows (answers checked against their documents)."""
    r = random.Random(f"search-{seed}")
    nm = Names(r)
    provinces = [
        Entity("province", nm.new(2, ["ia", "mark", "land"]), {"direction": d}) for d in DIRECTIONS
    ]
    rivers = [
        Entity(
            "river",
            nm.new(2),
            {"length": r.randint(40, 900), "hills": nm.new(2), "lake": nm.new(2)},
        )
        for _ in range(20)
    ]
    towns = [
        Entity(
            "town",
            nm.new(2, TOWN_ENDS),
            {
                "province": provinces[i % 6],
                "river": rivers[i % 20],
                "founded": r.randint(1150, 1950),
                "pop": r.randint(2000, 480000),
                "special": r.choice(SPECIALTIES),
            },
        )
        for i in range(60)
    ]
    people = []
    for _ in range(120):
        first, last, job = nm.new(1, FIRST_ENDS), nm.new(2, LAST_ENDS), r.choice(JOBS)
        facts = {
            "last": last,
            "job": job,
            "a_job": with_article(job),
            "born": r.randint(1925, 1975),
            "home": r.choice(towns),
            "hobby": r.choice(HOBBIES),
            "roles": "",  # mayor and founder sentences, added below
        }
        people.append(Entity("person", f"{first} {last}", facts))
    for t, p in zip(towns, people[:60], strict=True):
        t.facts["mayor"] = p
        p.facts["roles"] += (
            f" {p.last} has been the mayor of {t.name} since {p.born + r.randint(30, 48)}."
        )
    companies = []
    for p in people[20:90]:  # 40 mayors and 30 others found a company
        suffix = r.choice(sorted(INDUSTRIES))
        industry, products = INDUSTRIES[suffix]
        c = Entity(
            "company",
            f"{nm.new(2)} {suffix}",
            {
                "a_industry": with_article(industry),
                "product": r.choice(products),
                "founder": p,
                "founded": p.born + r.randint(22, 40),
                "hq": r.choice(towns),
                "staff": r.randint(12, 9000),
            },
        )
        p.facts["company"] = c
        p.facts["roles"] += f" In {c.founded}, {p.last} founded {c.name}."
        companies.append(c)
    for pv in provinces:
        mine = [t.name for t in towns if t.province is pv]
        pv.facts.update(
            capital=next(t for t in towns if t.province is pv), others=listing(mine[1:])
        )
    entities = [*provinces, *rivers, *towns, *people, *companies]
    docs = []
    for i, e in enumerate(entities):
        e.id = f"{e.kind}-{i:03d}"
        title = f"{e.name} River" if e.kind == "river" else e.name
        docs.append({"id": e.id, "title": title, "text": TEXTS[e.kind].format(e=e)})
    texts = {d["id"]: normalize_answer(d["text"]) for d in docs}
    one, two = [], []
    for e in entities:
        for q, a in ONE_HOP.get(e.kind, []):
            one.append((q.format(e=e), a.format(e=e), [e.id]))
        for q, a, bridge in TWO_HOP.get(e.kind, []):
            try:
                target = attrgetter(bridge)(e)
            except AttributeError:  # e.g. a mayor who founded no company
                continue
            two.append((q.format(e=e), a.format(e=e), [e.id, target.id]))
    r.shuffle(one)
    r.shuffle(two)
    n_two = (N_TRAIN + N_TEST) * 3 // 10
    rows = []
    for q, ans, support in one[: N_TRAIN + N_TEST - n_two] + two[:n_two]:
        assert normalize_answer(ans) in texts[support[-1]], (q, ans, support)
        rows.append(row("search", q, ans, {"hops": len(support), "support": support}))
    return docs, rows


def with_article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
