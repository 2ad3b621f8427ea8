"""What only the training script draws from the demo corpus: groups of questions sharing their
passages (more signal per training sequence) and every string the corpus can emit (the
tokenizer's vocabulary)."""

from __future__ import annotations

import random
from collections.abc import Iterator

from blendrag_demo.corpus import (
    CROSS_CHUNK_KINDS,
    KINDS,
    PREFIX,
    SUFFIX_TEMPLATE,
    QAExample,
    Scene,
    build_scene,
    generate_with_scenes,
    scene_questions,
)
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

TRAIN_SEED_BASE = 1_000
"""Training batch ``i`` is drawn with seed ``TRAIN_SEED_BASE + i`` (far below ``HELDOUT_SEED``)."""


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
    pairs = generate_with_scenes(n, seed, num_chunks, kind_weights)
    rng = random.Random(seed ^ 0x5EED)
    return [_group(head, scene, rng, questions_per_group) for head, scene in pairs]


def _group(head: QAExample, scene: Scene, rng: random.Random, size: int) -> list[QAExample]:
    pool = [q for q in scene_questions(scene) if q[1] != head.question]
    weights = [2.0 if q[0] in CROSS_CHUNK_KINDS else 1.0 for q in pool]
    picked: list[tuple[str, str, list[str], list[int]]] = []
    while pool and len(picked) < size - 1:
        idx = rng.choices(range(len(pool)), weights=weights)[0]
        picked.append(pool.pop(idx))
        weights.pop(idx)
    return [head] + [QAExample(list(head.chunks), q, a, k, s) for k, q, a, s in picked]


def vocabulary_texts() -> Iterator[str]:
    """Every string the generator can emit words from (for building the tokenizer)."""
    yield PREFIX
    yield SUFFIX_TEMPLATE
    yield from FILLERS
    yield from PLACE_TEMPLATES
    for pool in (FEMALE_FIRST, MALE_FIRST, LAST_NAMES, CITIES, JOBS, COMPANIES, COMPANY_TYPES,
                 HOBBIES):
        yield from pool
    yield from PERSON_YEARS
    yield from COMPANY_YEARS
    yield from PLACE_YEARS
    yield from (
        " ".join(q for _, q, _, _ in scene_questions(s)) + " " + " ".join(s.chunks)
        for s in _sample_scenes()
    )


def _sample_scenes() -> Iterator[Scene]:
    rng = random.Random(12345)
    for kind in KINDS:
        for _ in range(40):
            yield build_scene(kind, 6, rng)[0]
