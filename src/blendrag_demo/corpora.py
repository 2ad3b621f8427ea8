"""The demo's corpora: real passages for a real model, generated ones for the tiny model.

A corpus is passages, questions with gold answers, and the prompt around them. The real one
(``data/real_corpus.json``, written for blendrag) has 20 encyclopedic passages and 12
questions that SmolLM2-135M-Instruct answers with a full prefill, 3 of them needing two
passages. The synthetic one is the tiny demo model's own format; its passages are fictional
and alike, so each question retrieves among its own passages only (``group``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REAL_CORPUS = Path(__file__).resolve().parent / "data" / "real_corpus.json"


@dataclass(frozen=True)
class Passage:
    id: str
    text: str  # what is embedded and put in the prompt (with its title)
    group: int = 0


@dataclass(frozen=True)
class Question:
    text: str
    answers: tuple[str, ...]
    passages: tuple[str, ...]  # ids of the passages the answer needs
    group: int = 0


@dataclass(frozen=True)
class DemoCorpus:
    """Passages and questions, and how a prompt is made of them: ``prefix`` + each retrieved
    passage formatted with ``document_prompt`` + ``suffix_template.format(question=...)``."""

    name: str
    prefix: str
    suffix_template: str
    document_prompt: str
    passages: tuple[Passage, ...]
    questions: tuple[Question, ...]
    retrieve_k: int = 4
    by_group: bool = False  # retrieval restricted to the question's group

    def suffix(self, question: str) -> str:
        return self.suffix_template.format(question=question)


def real_corpus(path: Path = REAL_CORPUS) -> DemoCorpus:
    data = json.loads(path.read_text(encoding="utf-8"))
    passages = tuple(Passage(p["id"], f"{p['title']}\n{p['text']}") for p in data["passages"])
    questions = tuple(Question(q["question"], tuple(q["answers"]),
                               tuple(q["passages"])) for q in data["questions"])
    return DemoCorpus("real", data["prefix"], data["suffix_template"], "{page_content}\n\n",
                      passages, questions)


def synthetic_corpus(questions: int, seed: int | None = None) -> DemoCorpus:
    """Held-out questions of the tiny model's synthetic corpus, each with its own passages."""
    from blendrag_demo.corpus import HELDOUT_SEED, PREFIX, SUFFIX_TEMPLATE, generate_examples

    examples = generate_examples(questions, HELDOUT_SEED if seed is None else seed)
    passages = tuple(
        Passage(f"{g}-{i}", text, g)
        for g, ex in enumerate(examples)
        for i, text in enumerate(ex.chunks)
    )
    qs = tuple(Question(ex.question, tuple(ex.answers),
                        tuple(f"{g}-{i}" for i in range(len(ex.chunks))), g)
               for g, ex in enumerate(examples))
    return DemoCorpus("synthetic", PREFIX, SUFFIX_TEMPLATE, "{page_content}\n", passages, qs,
                      retrieve_k=6, by_group=True)
