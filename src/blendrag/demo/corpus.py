"""Seeded synthetic multi-document QA corpus for the embedded demo model.

Every example is a handful of short passages (the RAG chunks), a question and its gold
answers. The passages describe people, companies and places with a small closed
vocabulary, so that a tiny model can learn the task in minutes on a CPU.

Question kinds (``KINDS``):

- ``single``: the answer and the entity it is about are stated in one passage.
- ``pronoun``: a person is named in one passage and the next passage goes on about them
  with "She"/"He" only ("Lena Park is a chemist from Oslo. ..." then "She was born in 1971.
  ..."). Answering "In which year was Lena Park born?" needs the second passage read in the
  context of the first: exactly what full KV reuse (chunks computed independently) loses.
- ``comparison``: "Who is older, A or B?" with the birth years in two passages.
- ``multihop``: "In which city is the employer of A based?": A's passage names the
  company, another passage says where the company is based.

Coreference rule of the corpus: a passage that starts with a pronoun continues the person
named in the passage right before it. Passages are ordered so that the rule always holds.

The prompt is ``PREFIX + chunk_1 + ... + chunk_n + suffix`` where each chunk is
``format_chunk(passage)`` and the suffix is ``format_suffix(question)``; the engine and the
training script tokenize the pieces separately and concatenate the ids (see
``encode_prompt``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from blendrag.eval.metrics import exact_match, normalize_answer  # noqa: F401  (one normalization, re-exported)

# --------------------------------------------------------------------------- prompt format

PREFIX = "Read the passages and answer the question in a few words.\nPassages:\n"
"""Instruction that starts every prompt (tokenized with the BOS token)."""

CHUNK_TEMPLATE = "{text}\n"
"""How one passage is written into the prompt: its text and a newline."""

SUFFIX_TEMPLATE = "Question: {question}\nAnswer:"
"""The suffix: the question and the answer cue; the answer follows it, then EOS."""

KINDS: tuple[str, ...] = ("single", "pronoun", "comparison", "multihop")
"""Question kinds, see the module docstring."""

CROSS_CHUNK_KINDS: frozenset[str] = frozenset({"pronoun", "comparison", "multihop"})
"""Kinds whose answer needs facts from two passages."""

DEFAULT_KIND_WEIGHTS: dict[str, float] = {"single": 0.3, "pronoun": 0.3, "comparison": 0.2, "multihop": 0.2}
"""Share of each kind drawn by ``generate_examples`` unless told otherwise."""


HELDOUT_SEED = 9_000_001
"""Seed of the held-out evaluation set; training draws its data from other seeds."""

TRAIN_SEED_BASE = 1_000
"""Training batch ``i`` is drawn with seed ``TRAIN_SEED_BASE + i`` (far below ``HELDOUT_SEED``)."""


def format_chunk(text: str) -> str:
    """The prompt piece of one passage."""
    return CHUNK_TEMPLATE.format(text=text)


def format_suffix(question: str) -> str:
    """The prompt piece after the passages: question and answer cue."""
    return SUFFIX_TEMPLATE.format(question=question)


@dataclass(frozen=True)
class PromptPieces:
    """The three kinds of prompt pieces, each tokenized on its own (DESIGN.md section 2)."""

    prefix: str
    chunks: list[str]
    suffix: str


def prompt_pieces(chunks: Sequence[str], question: str) -> PromptPieces:
    """Prefix, formatted chunks and suffix of the prompt for ``question`` over ``chunks``."""
    return PromptPieces(PREFIX, [format_chunk(c) for c in chunks], format_suffix(question))


def encode_pieces(tokenizer: Any, pieces: PromptPieces) -> tuple[list[int], list[list[int]], list[int]]:
    """Token ids of the prefix (with BOS), of each chunk and of the suffix (no specials)."""
    prefix = list(tokenizer(pieces.prefix, add_special_tokens=True)["input_ids"])
    chunks = [list(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in pieces.chunks]
    suffix = list(tokenizer(pieces.suffix, add_special_tokens=False)["input_ids"])
    return prefix, chunks, suffix


def encode_prompt(tokenizer: Any, chunks: Sequence[str], question: str) -> list[int]:
    """The prompt ids: prefix ids + each chunk's ids + suffix ids, tokenized piece by piece."""
    prefix, chunk_ids, suffix = encode_pieces(tokenizer, prompt_pieces(chunks, question))
    return prefix + [t for ids in chunk_ids for t in ids] + suffix


# --------------------------------------------------------------------------- vocabulary

FEMALE_FIRST = (
    "Lena", "Maria", "Sofia", "Anna", "Clara", "Nina", "Emma", "Julia", "Laura", "Sara",
    "Alice", "Hana", "Mei", "Priya", "Olga", "Rosa", "Elena", "Ines", "Yuki", "Amara",
    "Greta", "Ida", "Nora", "Zoe", "Lucia", "Maya", "Tara", "Vera", "Aisha", "Leila",
)
MALE_FIRST = (
    "Omar", "Ivan", "Paul", "Marco", "Tomas", "Lukas", "David", "Felix", "Hugo", "Oscar",
    "Kenji", "Ravi", "Diego", "Samuel", "Victor", "Jonas", "Mateo", "Pedro", "Emil", "Hassan",
    "Arjun", "Leon", "Noah", "Erik", "Bruno", "Kofi", "Stefan", "Oliver", "Rafael", "Adam",
)
LAST_NAMES = (
    "Park", "Diaz", "Novak", "Berg", "Costa", "Silva", "Tanaka", "Weber", "Rossi", "Khan",
    "Moreau", "Jensen", "Ortiz", "Kim", "Fischer", "Haddad", "Nowak", "Sato", "Lopez", "Varga",
    "Eriksen", "Mendes", "Okafor", "Petrov", "Quinn", "Reyes", "Singh", "Torres", "Ueda", "Vance",
    "Walsh", "Young", "Zhou", "Abbott", "Brandt", "Chen", "Dalton", "Ferreira", "Garcia", "Horvat",
)
CITIES = (
    "Oslo", "Lima", "Cairo", "Dublin", "Lisbon", "Seoul", "Nairobi", "Quito", "Vienna", "Prague",
    "Madrid", "Lagos", "Manila", "Hanoi", "Bogota", "Athens", "Berlin", "Tokyo", "Delhi", "Havana",
    "Riga", "Tunis", "Perth", "Denver", "Austin", "Boston", "Geneva", "Porto", "Kyoto", "Santiago",
)
JOBS = (
    "chemist", "pilot", "teacher", "nurse", "architect", "lawyer", "painter", "baker", "engineer",
    "farmer", "journalist", "dentist", "actor", "librarian", "surgeon", "plumber", "chef", "poet",
    "sailor", "judge",
)
COMPANIES = (
    "Norvex", "Altura", "Brightwell", "Corvane", "Delmar", "Estrix", "Fenwick", "Glenmoor",
    "Halvex", "Irondale", "Jaspera", "Kestrel", "Lumora", "Maxwell", "Nortech", "Orbis",
    "Pinecrest", "Quorra", "Redfield", "Solvane", "Trivex", "Umbra", "Veltra", "Westmark",
    "Xylon", "Yarrow", "Zentro", "Amberly", "Bluestone", "Cobalt",
)
COMPANY_TYPES = (
    "bank", "airline", "publisher", "shipyard", "brewery", "studio", "insurer", "carmaker",
    "pharmacy", "bakery", "mine", "hotel",
)
HOBBIES = (
    "chess", "tennis", "fishing", "gardening", "cycling", "swimming", "hiking", "cooking",
    "knitting", "golf", "surfing", "dancing", "rowing", "skiing", "archery", "singing",
)
PERSON_YEARS = tuple(str(y) for y in range(1940, 2000))
COMPANY_YEARS = tuple(str(y) for y in range(1850, 1940))
PLACE_YEARS = tuple(str(y) for y in range(1900, 2000))
FILLERS = (
    "The weather was mild that year.",
    "Many visitors come in the summer.",
    "The local paper wrote about it twice.",
    "Nobody expected such a quiet start.",
    "The old bridge nearby is still in use.",
    "Prices in the area rose quickly.",
    "The streets there are narrow and busy.",
    "A small park lies across the road.",
    "The rainy season lasts for months.",
    "Trains to the coast leave every hour.",
    "The town hall was painted green.",
    "Most shops close early on Sundays.",
)
PLACE_TEMPLATES = (
    "The museum in {city} opened in {year}.",
    "A new stadium was built in {city} in {year}.",
    "The old harbor of {city} was rebuilt in {year}.",
    "{city} hosted a large festival in {year}.",
)


def _article(noun: str) -> str:
    return "an" if noun[0] in "aeiou" else "a"


# --------------------------------------------------------------------------- entities


@dataclass(frozen=True)
class _Person:
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
class _Company:
    name: str
    kind: str
    city: str
    year: str


class _Pools:
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


def _new_person(pools: _Pools, split: bool, employer: str | None = None) -> _Person:
    rng = pools.rng
    female = rng.random() < 0.5
    first = pools.take("first", FEMALE_FIRST if female else MALE_FIRST)
    return _Person(
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


def _new_company(pools: _Pools, name: str | None = None, avoid_city: str = "") -> _Company:
    return _Company(
        name=name if name is not None else pools.take("company", COMPANIES),
        kind=pools.rng.choice(COMPANY_TYPES),
        city=pools.take("company_city", CITIES, avoid=(avoid_city,)),
        year=pools.take("company_year", COMPANY_YEARS),
    )


# --------------------------------------------------------------------------- passages


def _fillers(rng: random.Random, lo: int, hi: int) -> list[str]:
    return rng.sample(FILLERS, rng.randint(lo, hi))


def _person_intro(p: _Person, rng: random.Random) -> str:
    if rng.random() < 0.5:
        first = f"{p.name} is {_article(p.job)} {p.job} from {p.city}."
    else:
        first = f"{p.name} comes from {p.city} and works as {_article(p.job)} {p.job}."
    sents = [first, f"{p.subj} works for {p.employer}."]
    if not p.split:
        sents += _person_details(p, rng)
    return " ".join(sents + _fillers(rng, 1 if p.split else 0, 1))


def _person_details(p: _Person, rng: random.Random) -> list[str]:
    if rng.random() < 0.5:
        born = f"{p.subj} was born in {p.year}."
    else:
        born = f"{p.subj} was born in {p.year} in a small house."
    return [born, f"In {p.poss} free time {p.subj.lower()} enjoys {p.hobby}."]


def _person_continuation(p: _Person, rng: random.Random) -> str:
    return " ".join(_person_details(p, rng) + _fillers(rng, 1, 1))


def _company_passage(c: _Company, rng: random.Random) -> str:
    if rng.random() < 0.5:
        first = f"{c.name} is {_article(c.kind)} {c.kind} based in {c.city}."
    else:
        first = f"The {c.kind} {c.name} is based in {c.city}."
    return " ".join([first, f"It was founded in {c.year}."] + _fillers(rng, 0, 1))


def _place_passage(pools: _Pools) -> str:
    rng = pools.rng
    city = pools.take("place_city", CITIES)
    sents = [t.format(city=city, year=rng.choice(PLACE_YEARS)) for t in rng.sample(PLACE_TEMPLATES, 2)]
    return " ".join(sents + _fillers(pools.rng, 0, 1))


# --------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class QAExample:
    """One multi-document question.

    ``chunks`` are the passage texts (without the prompt formatting of ``format_chunk``),
    ``answers`` the gold answers (any of them counts), ``kind`` one of ``KINDS`` and
    ``support`` the indices of the passages the answer is derived from.
    """

    chunks: list[str]
    question: str
    answers: list[str]
    kind: str
    support: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.chunks or any(not isinstance(c, str) or not c for c in self.chunks):
            raise ValueError("chunks must be a non-empty list of non-empty strings")
        if not self.question:
            raise ValueError("question must be non-empty")
        if not self.answers or any(not a for a in self.answers):
            raise ValueError("answers must be a non-empty list of non-empty strings")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if any(not 0 <= i < len(self.chunks) for i in self.support):
            raise ValueError("support indices must point into chunks")


@dataclass(frozen=True)
class _Unit:
    """Passages about one entity, kept adjacent: (texts, entity)."""

    texts: tuple[str, ...]
    entity: _Person | _Company | None


@dataclass
class _Scene:
    chunks: list[str]
    persons: list[tuple[_Person, int]]  # person, index of the intro passage
    companies: dict[str, tuple[_Company, int]]  # name -> company, passage index


_MIN_CHUNKS = {"single": 1, "pronoun": 2, "comparison": 2, "multihop": 2}


def _required_units(kind: str, pools: _Pools, room: int) -> list[_Person | _Company]:
    rng = pools.rng
    if kind == "pronoun":
        return [_new_person(pools, split=True)]
    if kind == "comparison":
        return [_new_person(pools, split=room >= 3 and rng.random() < 0.5), _new_person(pools, split=False)]
    if kind == "multihop":
        name = pools.take("company", COMPANIES)
        person = _new_person(pools, split=room >= 3 and rng.random() < 0.3, employer=name)
        return [person, _new_company(pools, name=name, avoid_city=person.city)]
    roll = rng.random()
    if roll < 0.4:
        return [_new_person(pools, split=False)]
    if roll < 0.7 and room >= 2:
        return [_new_person(pools, split=True)]
    return [_new_company(pools)]


def _n_texts(entity: _Person | _Company | None) -> int:
    return 2 if isinstance(entity, _Person) and entity.split else 1


def _distractor(pools: _Pools, room: int, companies_in_scene: list[str]) -> _Person | _Company | None:
    rng = pools.rng
    roll = rng.random()
    if roll < 0.15:
        return None  # a place passage
    if roll < 0.45:
        return _new_company(pools)
    split = room >= 2 and rng.random() < 0.5
    employer = rng.choice(companies_in_scene) if companies_in_scene and rng.random() < 0.4 else None
    return _new_person(pools, split=split, employer=employer)


def _render(entity: _Person | _Company | None, pools: _Pools) -> _Unit:
    rng = pools.rng
    if isinstance(entity, _Person):
        texts = (_person_intro(entity, rng),) + ((_person_continuation(entity, rng),) if entity.split else ())
        return _Unit(texts, entity)
    if isinstance(entity, _Company):
        return _Unit((_company_passage(entity, rng),), entity)
    return _Unit((_place_passage(pools),), None)


def _build_scene(kind: str, num_chunks: int, rng: random.Random) -> tuple[_Scene, list[_Person | _Company]]:
    pools = _Pools(rng)
    targets = _required_units(kind, pools, num_chunks)
    entities: list[_Person | _Company | None] = list(targets)
    room = num_chunks - sum(_n_texts(e) for e in entities)
    while room > 0:
        names = [e.name for e in entities if isinstance(e, _Company)]
        extra = _distractor(pools, room, names)
        entities.append(extra)
        room -= _n_texts(extra)
    rng.shuffle(entities)
    scene = _Scene(chunks=[], persons=[], companies={})
    for entity in entities:
        unit = _render(entity, pools)
        if isinstance(entity, _Person):
            scene.persons.append((entity, len(scene.chunks)))
        elif isinstance(entity, _Company):
            scene.companies[entity.name] = (entity, len(scene.chunks))
        scene.chunks.extend(unit.texts)
    return scene, targets


def _intro_index(scene: _Scene, person: _Person) -> int:
    return next(i for p, i in scene.persons if p is person)


def _year_index(scene: _Scene, person: _Person) -> int:
    return _intro_index(scene, person) + (1 if person.split else 0)


def _person_questions(scene: _Scene, p: _Person) -> list[tuple[str, str, list[str], list[int]]]:
    """All (kind, question, answers, support) about one person."""
    i = _intro_index(scene, p)
    j = _year_index(scene, p)
    detail_kind = "pronoun" if p.split else "single"
    support_detail = [i, j] if p.split else [i]
    out = [
        ("single", f"What is the job of {p.name}?", [p.job], [i]),
        ("single", f"Which city is {p.name} from?", [p.city], [i]),
        ("single", f"Which company does {p.name} work for?", [p.employer], [i]),
        (detail_kind, f"In which year was {p.name} born?", [p.year], support_detail),
        (detail_kind, f"What does {p.name} enjoy in {p.poss} free time?", [p.hobby], support_detail),
    ]
    if p.employer in scene.companies:
        company, k = scene.companies[p.employer]
        out.append(("multihop", f"In which city is the employer of {p.name} based?", [company.city], sorted({i, k})))
        out.append(("multihop", f"In which year was the employer of {p.name} founded?", [company.year], sorted({i, k})))
    return out


def _company_questions(scene: _Scene, c: _Company) -> list[tuple[str, str, list[str], list[int]]]:
    k = scene.companies[c.name][1]
    return [
        ("single", f"Where is {c.name} based?", [c.city], [k]),
        ("single", f"In which year was {c.name} founded?", [c.year], [k]),
    ]


def _comparison_questions(scene: _Scene, a: _Person, b: _Person) -> list[tuple[str, str, list[str], list[int]]]:
    older, younger = (a, b) if int(a.year) < int(b.year) else (b, a)
    support = sorted({_year_index(scene, a), _year_index(scene, b), _intro_index(scene, a), _intro_index(scene, b)})
    return [
        ("comparison", f"Who is older, {a.name} or {b.name}?", [older.name], support),
        ("comparison", f"Who is younger, {a.name} or {b.name}?", [younger.name], support),
    ]


def _all_questions(scene: _Scene) -> list[tuple[str, str, list[str], list[int]]]:
    out: list[tuple[str, str, list[str], list[int]]] = []
    for p, _ in scene.persons:
        out += _person_questions(scene, p)
    for c, _ in scene.companies.values():
        out += _company_questions(scene, c)
    persons = [p for p, _ in scene.persons]
    for x in range(len(persons)):
        for y in range(x + 1, len(persons)):
            out += _comparison_questions(scene, persons[x], persons[y])
    return out


def _target_questions(scene: _Scene, kind: str, targets: list[_Person | _Company]) -> list[tuple[str, str, list[str], list[int]]]:
    if kind == "comparison":
        a, b = targets
        return _comparison_questions(scene, a, b)  # type: ignore[arg-type]
    target = targets[0]
    pool = _person_questions(scene, target) if isinstance(target, _Person) else _company_questions(scene, target)
    return [q for q in pool if q[0] == kind]


def _resolve_num_chunks(num_chunks: int | tuple[int, int], rng: random.Random) -> int:
    if isinstance(num_chunks, int):
        return num_chunks
    lo, hi = num_chunks
    return rng.randint(lo, hi)


def _check_num_chunks(num_chunks: int | tuple[int, int]) -> None:
    lo, hi = (num_chunks, num_chunks) if isinstance(num_chunks, int) else num_chunks
    if lo < 1 or hi < lo:
        raise ValueError(f"num_chunks must be >= 1 (or a range lo <= hi), got {num_chunks!r}")


def _check_weights(kind_weights: dict[str, float]) -> None:
    if not kind_weights or any(k not in KINDS or w < 0 for k, w in kind_weights.items()):
        raise ValueError(f"kind_weights keys must be in {KINDS} with weights >= 0")
    if sum(kind_weights.values()) <= 0:
        raise ValueError("kind_weights must not all be zero")


def _pick_kind(rng: random.Random, kind_weights: dict[str, float], n_chunks: int) -> str:
    kinds = [k for k in kind_weights if _MIN_CHUNKS[k] <= n_chunks and kind_weights[k] > 0]
    if not kinds:
        return "single"
    return rng.choices(kinds, weights=[kind_weights[k] for k in kinds])[0]


def generate_examples(
    n: int,
    seed: int,
    num_chunks: int | tuple[int, int] = (4, 6),
    kind_weights: dict[str, float] | None = None,
) -> list[QAExample]:
    """``n`` examples, reproducible from ``seed``.

    ``num_chunks`` is a passage count or an inclusive range drawn per example. Kinds are
    drawn with ``kind_weights`` (default ``DEFAULT_KIND_WEIGHTS``); kinds that need two
    passages fall back to ``single`` when an example has one passage.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    _check_num_chunks(num_chunks)
    weights = dict(DEFAULT_KIND_WEIGHTS if kind_weights is None else kind_weights)
    _check_weights(weights)
    return [example for example, _ in _generate(n, seed, num_chunks, weights)]


def _generate(
    n: int, seed: int, num_chunks: int | tuple[int, int], weights: dict[str, float]
) -> list[tuple[QAExample, _Scene]]:
    rng = random.Random(seed)
    return [_one_example(rng, num_chunks, weights) for _ in range(n)]


def _one_example(
    rng: random.Random, num_chunks: int | tuple[int, int], weights: dict[str, float]
) -> tuple[QAExample, _Scene]:
    count = _resolve_num_chunks(num_chunks, rng)
    kind = _pick_kind(rng, weights, count)
    scene, targets = _build_scene(kind, count, rng)
    q_kind, question, answers, support = rng.choice(_target_questions(scene, kind, targets))
    return QAExample(list(scene.chunks), question, answers, q_kind, support), scene


def generate_question_groups(
    n: int,
    seed: int,
    num_chunks: int | tuple[int, int] = (4, 6),
    questions_per_group: int = 6,
    kind_weights: dict[str, float] | None = None,
) -> list[list[QAExample]]:
    """``n`` groups of examples that share their passages (for training).

    The first example of each group is ``generate_examples(n, seed, ...)[i]``; up to
    ``questions_per_group - 1`` more questions about the same passages follow, drawn
    without repetition with cross-chunk kinds preferred.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    if questions_per_group < 1:
        raise ValueError("questions_per_group must be >= 1")
    _check_num_chunks(num_chunks)
    weights = dict(DEFAULT_KIND_WEIGHTS if kind_weights is None else kind_weights)
    _check_weights(weights)
    rng = random.Random(seed ^ 0x5EED)
    return [_group(head, scene, rng, questions_per_group) for head, scene in _generate(n, seed, num_chunks, weights)]


def _group(head: QAExample, scene: _Scene, rng: random.Random, size: int) -> list[QAExample]:
    pool = [q for q in _all_questions(scene) if q[1] != head.question]
    weights = [2.0 if q[0] in CROSS_CHUNK_KINDS else 1.0 for q in pool]
    picked: list[tuple[str, str, list[str], list[int]]] = []
    while pool and len(picked) < size - 1:
        idx = rng.choices(range(len(pool)), weights=weights)[0]
        picked.append(pool.pop(idx))
        weights.pop(idx)
    return [head] + [QAExample(list(head.chunks), q, a, k, s) for k, q, a, s in picked]


# ----------------------------------------------------------------- reading passages back

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
    (re.compile(rf"In which city is the employer of {_N} based\?"), lambda f, a: f[f[a]["employer"]]["city"]),
    (re.compile(rf"In which year was the employer of {_N} founded\?"), lambda f, a: f[f[a]["employer"]]["year"]),
    (re.compile(r"Where is ([A-Z][a-z]+) based\?"), lambda f, c: f[c]["city"]),
    (re.compile(r"In which year was ([A-Z][a-z]+) founded\?"), lambda f, c: f[c]["year"]),
    (re.compile(rf"Who is older, {_N} or {_N}\?"), lambda f, a, b: _older(f, a, b, younger=False)),
    (re.compile(rf"Who is younger, {_N} or {_N}\?"), lambda f, a, b: _older(f, a, b, younger=True)),
)


# --------------------------------------------------------------------------- scoring

# --------------------------------------------------------------------------- vocabulary


def vocabulary_texts() -> Iterator[str]:
    """Every string the generator can emit words from (for building the tokenizer)."""
    yield PREFIX
    yield SUFFIX_TEMPLATE
    yield from FILLERS
    yield from PLACE_TEMPLATES
    for pool in (FEMALE_FIRST, MALE_FIRST, LAST_NAMES, CITIES, JOBS, COMPANIES, COMPANY_TYPES, HOBBIES):
        yield from pool
    yield from PERSON_YEARS
    yield from COMPANY_YEARS
    yield from PLACE_YEARS
    yield from (" ".join(q for _, q, _, _ in _all_questions(s)) + " " + " ".join(s.chunks) for s in _sample_scenes())


def _sample_scenes() -> Iterator[_Scene]:
    rng = random.Random(12345)
    for kind in KINDS:
        for _ in range(40):
            yield _build_scene(kind, 6, rng)[0]
