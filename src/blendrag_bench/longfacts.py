"""The long-context fact set: the CacheBlend paper's prompt shape, with questions a small model
can answer.

Each item is ``passages`` passages of real text (the shipped MuSiQue passages, CC BY 4.0), each
cut to ``words`` words (about 300 tokens), in the demo's short instruction prompt: about 1,700-
2,150 tokens for the defaults. One or two of them open with an inserted fact sentence about an
invented person or company; the other passages are distractors. Question kinds (two ``one`` to
each ``two``):

- ``one``: the answer is stated in one passage ("In which city was Lena Park born?").
- ``two``: one passage says where a person works, another where that company is based ("In
  which city is the company that Lena Park works for based?"), so the answer needs both.

Everything is drawn from a seeded generator: item ``i`` is the same on every machine. Items are
scored with ``contains`` (the gold answer occurs in the answer). Tuning used items from 100 on;
the benchmarks report the items before.

Why this shape: SmolLM2-135M-Instruct rarely finds a fact inside 2,000 tokens of real text; it
does best when the fact opens its passage and the instruction is short (3 of 10 development
items; with the CacheBlend prompt and the facts in mid-passage, 1 of 12). Its full-prefill
quality per kind is in docs/benchmarks.md: a larger model is what this set is for.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from blendrag_bench.datasets import MUSIQUE_PATH, EvalItem
from blendrag_demo.prompt_format import PREFIX, format_chunk, format_suffix
from blendrag_demo.vocab import CITIES, COMPANIES, FEMALE_FIRST, JOBS, LAST_NAMES, MALE_FIRST

LONGFACTS_SEED = 2025
KINDS = ("one", "one", "two")  # drawn uniformly: two one-passage questions to each two


def _passages(path: Path) -> list[str]:
    """Every distinct passage text of the MuSiQue file, in file order."""
    records = json.loads(path.read_text(encoding="utf-8"))
    seen: dict[str, None] = {}
    for record in records:
        for ctx in record["ctxs"]:
            seen.setdefault(ctx["text"].strip(), None)
    return list(seen)


def _item(rng: random.Random, pool: list[str], passages: int, words: int) -> EvalItem:
    first = rng.choice(FEMALE_FIRST + MALE_FIRST)
    name = f"{first} {rng.choice(LAST_NAMES)}"
    city, company = rng.choice(CITIES), rng.choice(COMPANIES)
    texts = [" ".join(t.split()[:words]) for t in rng.sample(pool, passages)]
    kind = rng.choice(KINDS)
    slots = rng.sample(range(passages), 2)
    if kind == "one":
        job = rng.choice(JOBS)
        texts[slots[0]] = f"{name} is a {job} who was born in {city}. {texts[slots[0]]}"
        question = f"In which city was {name} born?"
    else:
        texts[slots[0]] = f"{name} works for a company called {company}. {texts[slots[0]]}"
        texts[slots[1]] = f"The company {company} is based in {city}. {texts[slots[1]]}"
        question = f"In which city is the company that {name} works for based?"
    return EvalItem(PREFIX, tuple(format_chunk(t) for t in texts), format_suffix(question),
                    (city,), kind, metric="contains")


def load_longfacts(limit: int | None = None, offset: int = 0, passages: int = 6,
                   words: int = 200, seed: int = LONGFACTS_SEED,
                   path: str | Path | None = None) -> list[EvalItem]:
    """Items ``offset .. offset + limit`` (default 40) of the long-context fact set (see the
    module docstring); ``passages`` per prompt (>= 2), each cut to ``words`` words."""
    if passages < 2:
        raise ValueError(f"passages must be >= 2 (a fact may need two), got {passages}")
    if words < 20:
        raise ValueError(f"words must be >= 20, got {words}")
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError(f"limit and offset must be >= 0, got {limit} and {offset}")
    pool = _passages(Path(path or MUSIQUE_PATH))
    rng = random.Random(seed)
    count = 40 if limit is None else limit
    items = [_item(rng, pool, passages, words) for _ in range(offset + count)]
    return items[offset:]
