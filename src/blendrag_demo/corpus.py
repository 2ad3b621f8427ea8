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

Word pools live in ``vocab.py``, the entities and their passages in ``entities.py`` and the
prompt format in ``prompt_format.py``; this module re-exports the prompt format's public
names. What only the training script needs (question
groups, the tokenizer's vocabulary, an independent reader of the passages) lives beside it in
``scripts/training/``.

The prompt is ``PREFIX + chunk_1 + ... + chunk_n + suffix`` where each chunk is
``format_chunk(passage)`` and the suffix is ``format_suffix(question)``; the engine and the
training script tokenize the pieces separately and concatenate the ids (see
``encode_prompt``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from blendrag.eval.metrics import exact_match, normalize_answer  # noqa: F401  (one normalization, re-exported)
from blendrag_demo.entities import (
    Company,
    Person,
    Pools,
    company_passage,
    new_company,
    new_person,
    person_continuation,
    person_intro,
    place_passage,
)
from blendrag_demo.prompt_format import (  # noqa: F401  (re-exported: the corpus's public names)
    CHUNK_TEMPLATE,
    PREFIX,
    SUFFIX_TEMPLATE,
    PromptPieces,
    encode_pieces,
    encode_prompt,
    format_chunk,
    format_suffix,
    prompt_pieces,
)
from blendrag_demo.vocab import COMPANIES

KINDS: tuple[str, ...] = ("single", "pronoun", "comparison", "multihop")
"""Question kinds, see the module docstring."""

CROSS_CHUNK_KINDS: frozenset[str] = frozenset({"pronoun", "comparison", "multihop"})
"""Kinds whose answer needs facts from two passages."""

DEFAULT_KIND_WEIGHTS: dict[str, float] = {"single": 0.3, "pronoun": 0.3, "comparison": 0.2,
                                          "multihop": 0.2}
"""Share of each kind drawn by ``generate_examples`` unless told otherwise."""


HELDOUT_SEED = 9_000_001
"""Seed of the held-out evaluation set; training draws its data from other seeds."""



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
    entity: Person | Company | None


@dataclass
class Scene:
    """One example's passages and the entities they describe (with their passage indices)."""

    chunks: list[str]
    persons: list[tuple[Person, int]]  # person, index of the intro passage
    companies: dict[str, tuple[Company, int]]  # name -> company, passage index


_MIN_CHUNKS = {"single": 1, "pronoun": 2, "comparison": 2, "multihop": 2}


def _required_units(kind: str, pools: Pools, room: int) -> list[Person | Company]:
    rng = pools.rng
    if kind == "pronoun":
        return [new_person(pools, split=True)]
    if kind == "comparison":
        return [new_person(pools, split=room >= 3 and rng.random() < 0.5),
                new_person(pools, split=False)]
    if kind == "multihop":
        name = pools.take("company", COMPANIES)
        person = new_person(pools, split=room >= 3 and rng.random() < 0.3, employer=name)
        return [person, new_company(pools, name=name, avoid_city=person.city)]
    roll = rng.random()
    if roll < 0.4:
        return [new_person(pools, split=False)]
    if roll < 0.7 and room >= 2:
        return [new_person(pools, split=True)]
    return [new_company(pools)]


def _n_texts(entity: Person | Company | None) -> int:
    return 2 if isinstance(entity, Person) and entity.split else 1


def _distractor(pools: Pools, room: int,
                companies_in_scene: list[str]) -> Person | Company | None:
    rng = pools.rng
    roll = rng.random()
    if roll < 0.15:
        return None  # a place passage
    if roll < 0.45:
        return new_company(pools)
    split = room >= 2 and rng.random() < 0.5
    employer = rng.choice(companies_in_scene) if companies_in_scene and rng.random() < 0.4 else None
    return new_person(pools, split=split, employer=employer)


def _render(entity: Person | Company | None, pools: Pools) -> _Unit:
    rng = pools.rng
    if isinstance(entity, Person):
        texts = (person_intro(entity, rng),)
        if entity.split:
            texts += (person_continuation(entity, rng),)
        return _Unit(texts, entity)
    if isinstance(entity, Company):
        return _Unit((company_passage(entity, rng),), entity)
    return _Unit((place_passage(pools),), None)


def build_scene(
    kind: str, num_chunks: int, rng: random.Random
) -> tuple[Scene, list[Person | Company]]:
    pools = Pools(rng)
    targets = _required_units(kind, pools, num_chunks)
    entities: list[Person | Company | None] = list(targets)
    room = num_chunks - sum(_n_texts(e) for e in entities)
    while room > 0:
        names = [e.name for e in entities if isinstance(e, Company)]
        extra = _distractor(pools, room, names)
        entities.append(extra)
        room -= _n_texts(extra)
    rng.shuffle(entities)
    scene = Scene(chunks=[], persons=[], companies={})
    for entity in entities:
        unit = _render(entity, pools)
        if isinstance(entity, Person):
            scene.persons.append((entity, len(scene.chunks)))
        elif isinstance(entity, Company):
            scene.companies[entity.name] = (entity, len(scene.chunks))
        scene.chunks.extend(unit.texts)
    return scene, targets


def _intro_index(scene: Scene, person: Person) -> int:
    return next(i for p, i in scene.persons if p is person)


def _year_index(scene: Scene, person: Person) -> int:
    return _intro_index(scene, person) + (1 if person.split else 0)


def _person_questions(scene: Scene, p: Person) -> list[tuple[str, str, list[str], list[int]]]:
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
        (detail_kind, f"What does {p.name} enjoy in {p.poss} free time?", [p.hobby],
         support_detail),
    ]
    if p.employer in scene.companies:
        company, k = scene.companies[p.employer]
        out.append(("multihop", f"In which city is the employer of {p.name} based?", [company.city],
                    sorted({i, k})))
        out.append(("multihop", f"In which year was the employer of {p.name} founded?",
                    [company.year], sorted({i, k})))
    return out


def _company_questions(scene: Scene, c: Company) -> list[tuple[str, str, list[str], list[int]]]:
    k = scene.companies[c.name][1]
    return [
        ("single", f"Where is {c.name} based?", [c.city], [k]),
        ("single", f"In which year was {c.name} founded?", [c.year], [k]),
    ]


def _comparison_questions(scene: Scene, a: Person,
                          b: Person) -> list[tuple[str, str, list[str], list[int]]]:
    older, younger = (a, b) if int(a.year) < int(b.year) else (b, a)
    support = sorted({_year_index(scene, a), _year_index(scene, b), _intro_index(scene, a),
                      _intro_index(scene, b)})
    return [
        ("comparison", f"Who is older, {a.name} or {b.name}?", [older.name], support),
        ("comparison", f"Who is younger, {a.name} or {b.name}?", [younger.name], support),
    ]


def scene_questions(scene: Scene) -> list[tuple[str, str, list[str], list[int]]]:
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


def _target_questions(
    scene: Scene, kind: str, targets: list[Person | Company]
) -> list[tuple[str, str, list[str], list[int]]]:
    if kind == "comparison":
        a, b = targets
        return _comparison_questions(scene, a, b)  # type: ignore[arg-type]
    target = targets[0]
    pool = (
        _person_questions(scene, target)
        if isinstance(target, Person)
        else _company_questions(scene, target)
    )
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
    return [example for example, _ in generate_with_scenes(n, seed, num_chunks, kind_weights)]


def generate_with_scenes(
    n: int,
    seed: int,
    num_chunks: int | tuple[int, int] = (4, 6),
    kind_weights: dict[str, float] | None = None,
) -> list[tuple[QAExample, Scene]]:
    """``generate_examples`` with each example's ``Scene`` (its entities and every question
    they support, ``scene_questions``): what the training script draws more questions from."""
    if n < 0:
        raise ValueError("n must be >= 0")
    _check_num_chunks(num_chunks)
    weights = dict(DEFAULT_KIND_WEIGHTS if kind_weights is None else kind_weights)
    _check_weights(weights)
    rng = random.Random(seed)
    return [_one_example(rng, num_chunks, weights) for _ in range(n)]


def _one_example(
    rng: random.Random, num_chunks: int | tuple[int, int], weights: dict[str, float]
) -> tuple[QAExample, Scene]:
    count = _resolve_num_chunks(num_chunks, rng)
    kind = _pick_kind(rng, weights, count)
    scene, targets = build_scene(kind, count, rng)
    q_kind, question, answers, support = rng.choice(_target_questions(scene, kind, targets))
    return QAExample(list(scene.chunks), question, answers, q_kind, support), scene
