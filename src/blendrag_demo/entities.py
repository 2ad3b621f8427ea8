"""The demo corpus's entities and the passages about them: people, companies and places drawn
from the closed word pools of ``vocab.py`` (no name, city or year twice in one example), and
each rendered as the short passages of ``corpus.py``'s examples. A person whose facts are
``split`` is told in two passages, the second led by a pronoun only (the coreference the
``pronoun`` questions need)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from blendrag_demo.vocab import (
    CITIES,
    COMPANIES,
    COMPANY_TYPES,
    COMPANY_YEARS,
    FEMALE_FIRST,
    FILLERS,
    HOBBIES,
    JOBS,
    LAST_NAMES,
    MALE_FIRST,
    PERSON_YEARS,
    PLACE_TEMPLATES,
    PLACE_YEARS,
)

# --------------------------------------------------------------------------- entities


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    female: bool
    job: str
    city: str
    employer: str
    year: str
    hobby: str
    split: bool  # birth year and hobby are told in a separate, pronoun-led passage

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def subj(self) -> str:
        return "She" if self.female else "He"

    @property
    def poss(self) -> str:
        return "her" if self.female else "his"


@dataclass(frozen=True)
class Company:
    name: str
    kind: str
    city: str
    year: str


class Pools:
    """Draws entity attributes without repetition inside one example."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._used: dict[str, set[str]] = {}

    def take(self, pool_name: str, pool: Sequence[str], avoid: Sequence[str] = ()) -> str:
        used = self._used.setdefault(pool_name, set())
        free = [x for x in pool if x not in used and x not in avoid]
        value = self.rng.choice(free)
        used.add(value)
        return value


def new_person(pools: Pools, split: bool, employer: str | None = None) -> Person:
    rng = pools.rng
    female = rng.random() < 0.5
    first = pools.take("first", FEMALE_FIRST if female else MALE_FIRST)
    return Person(
        first=first,
        last=pools.take("last", LAST_NAMES),
        female=female,
        job=rng.choice(JOBS),
        city=pools.take("city", CITIES),
        employer=employer if employer is not None else pools.take("company", COMPANIES),
        year=pools.take("person_year", PERSON_YEARS),
        hobby=rng.choice(HOBBIES),
        split=split,
    )


def new_company(pools: Pools, name: str | None = None, avoid_city: str = "") -> Company:
    return Company(
        name=name if name is not None else pools.take("company", COMPANIES),
        kind=pools.rng.choice(COMPANY_TYPES),
        city=pools.take("company_city", CITIES, avoid=(avoid_city,)),
        year=pools.take("company_year", COMPANY_YEARS),
    )


# --------------------------------------------------------------------------- passages


def _fillers(rng: random.Random, lo: int, hi: int) -> list[str]:
    return rng.sample(FILLERS, rng.randint(lo, hi))


def person_intro(p: Person, rng: random.Random) -> str:
    if rng.random() < 0.5:
        first = f"{p.name} is {_article(p.job)} {p.job} from {p.city}."
    else:
        first = f"{p.name} comes from {p.city} and works as {_article(p.job)} {p.job}."
    sents = [first, f"{p.subj} works for {p.employer}."]
    if not p.split:
        sents += _person_details(p, rng)
    return " ".join(sents + _fillers(rng, 1 if p.split else 0, 1))


def _person_details(p: Person, rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        born = f"{p.subj} was born in {p.year}."
    else:
        born = f"{p.subj} was born in {p.year} in a small house."
    return [born, f"In {p.poss} free time {p.subj.lower()} enjoys {p.hobby}."]


def person_continuation(p: Person, rng: random.Random) -> str:
    return " ".join(_person_details(p, rng) + _fillers(rng, 1, 1))


def company_passage(c: Company, rng: random.Random) -> str:
    if rng.random() < 0.5:
        first = f"{c.name} is {_article(c.kind)} {c.kind} based in {c.city}."
    else:
        first = f"The {c.kind} {c.name} is based in {c.city}."
    return " ".join([first, f"It was founded in {c.year}."] + _fillers(rng, 0, 1))


def place_passage(pools: Pools) -> str:
    rng = pools.rng
    city = pools.take("place_city", CITIES)
    sents = [
        t.format(city=city, year=rng.choice(PLACE_YEARS)) for t in rng.sample(PLACE_TEMPLATES, 2)
    ]
    return " ".join(sents + _fillers(pools.rng, 0, 1))
