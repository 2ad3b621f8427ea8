"""Reading the demo corpus's passages back into facts, and a reference solver for its questions.

Independent of the generator's internal state: the tests check with it that every answer is
derivable from the passages."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

_NAME = r"([A-Z][a-z]+ [A-Z][a-z]+)"
_PERSON_RES = (
    re.compile(_NAME + r" is an? ([a-z]+) from ([A-Z][a-z]+)\."),
    re.compile(_NAME + r" comes from ([A-Z][a-z]+) and works as an? ([a-z]+)\."),
)
_COMPANY_RES = (
    re.compile(r"^([A-Z][a-z]+) is an? ([a-z]+) based in ([A-Z][a-z]+)\."),
    re.compile(r"^The ([a-z]+) ([A-Z][a-z]+) is based in ([A-Z][a-z]+)\."),
)


def read_facts(chunks: Sequence[str]) -> dict[str, dict[str, str]]:
    """Facts stated by passages, resolving leading pronouns to the previous passage's person.

    Returns ``{entity name: {attribute: value}}`` with attributes ``job``, ``city``,
    ``employer``, ``year``, ``hobby`` for people and ``city``, ``year`` (founded) for
    companies. This is an independent reading of the text (used by the tests and by
    ``answer_from_facts``), not a lookup of the generator's internal state.
    """
    facts: dict[str, dict[str, str]] = {}
    last_person: str | None = None
    for text in chunks:
        name = _read_person(text, facts) or _read_company(text, facts)
        if name is None and re.match(r"^(She|He) ", text) and last_person is not None:
            name = last_person
        if name is not None and name in facts and "job" in facts[name]:
            _read_person_details(text, facts[name])
            last_person = name
        else:
            last_person = None
    return facts


def _read_person(text: str, facts: dict[str, dict[str, str]]) -> str | None:
    m0, m1 = _PERSON_RES[0].search(text), _PERSON_RES[1].search(text)
    if m0:
        name, job, city = m0.groups()
    elif m1:
        name, city, job = m1.groups()
    else:
        return None
    entry = facts.setdefault(name, {})
    entry.update(job=job, city=city)
    m = re.search(r"(?:She|He) works for ([A-Z][a-z]+)\.", text)
    if m:
        entry["employer"] = m.group(1)
    return name


def _read_company(text: str, facts: dict[str, dict[str, str]]) -> str | None:
    m0, m1 = _COMPANY_RES[0].search(text), _COMPANY_RES[1].search(text)
    if not (m0 or m1):
        return None
    name, city = (m0.group(1), m0.group(3)) if m0 else (m1.group(2), m1.group(3))  # type: ignore[union-attr]
    entry = facts.setdefault(name, {})
    entry["city"] = city
    m = re.search(r"It was founded in (\d{4})\.", text)
    if m:
        entry["year"] = m.group(1)
    return None  # companies are never continued by a pronoun passage


def _read_person_details(text: str, entry: dict[str, str]) -> None:
    m = re.search(r"(?:She|He) was born in (\d{4})", text)
    if m:
        entry["year"] = m.group(1)
    m = re.search(r"free time (?:she|he) enjoys ([a-z]+)\.", text)
    if m:
        entry["hobby"] = m.group(1)


def answer_from_facts(chunks: Sequence[str], question: str) -> str | None:
    """Answer a corpus question by reading the passages with ``read_facts`` (a reference solver)."""
    facts = read_facts(chunks)
    for pattern, solve in _SOLVERS:
        m = pattern.fullmatch(question)
        if m:
            try:
                return solve(facts, *m.groups())
            except KeyError:
                return None
    return None


def _older(facts: dict[str, dict[str, str]], a: str, b: str, younger: bool) -> str:
    ya, yb = int(facts[a]["year"]), int(facts[b]["year"])
    return (a if ya < yb else b) if not younger else (a if ya > yb else b)


_N = r"([A-Z][a-z]+ [A-Z][a-z]+)"
_SOLVERS: tuple[tuple[re.Pattern[str], Callable[..., str]], ...] = (
    (re.compile(rf"What is the job of {_N}\?"), lambda f, a: f[a]["job"]),
    (re.compile(rf"Which city is {_N} from\?"), lambda f, a: f[a]["city"]),
    (re.compile(rf"Which company does {_N} work for\?"), lambda f, a: f[a]["employer"]),
    (re.compile(rf"In which year was {_N} born\?"), lambda f, a: f[a]["year"]),
    (re.compile(rf"What does {_N} enjoy in (?:her|his) free time\?"), lambda f, a: f[a]["hobby"]),
    (re.compile(rf"In which city is the employer of {_N} based\?"), lambda f,
     a: f[f[a]["employer"]]["city"]),
    (re.compile(rf"In which year was the employer of {_N} founded\?"), lambda f,
     a: f[f[a]["employer"]]["year"]),
    (re.compile(r"Where is ([A-Z][a-z]+) based\?"), lambda f, c: f[c]["city"]),
    (re.compile(r"In which year was ([A-Z][a-z]+) founded\?"), lambda f, c: f[c]["year"]),
    (re.compile(rf"Who is older, {_N} or {_N}\?"), lambda f, a, b: _older(f, a, b, younger=False)),
    (re.compile(rf"Who is younger, {_N} or {_N}\?"), lambda f, a, b: _older(f, a, b, younger=True)),
)
