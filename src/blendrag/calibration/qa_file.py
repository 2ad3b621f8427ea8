"""Labelled questions for a calibration on answer quality (``blendrag calibrate --qa FILE``).

A JSON-lines file, one question a line::

    {"question": "In which city was Lena Park born?", "answer": "Oslo",
     "passages": ["Lena Park is a nurse who was born in Oslo. ...", "..."]}

``answer``: the gold answer, or a list of them (any one counts); ``passages``: what your
retriever gives the question, in the prompt's order. A line without ``passages`` takes the
``per_prompt`` passages of ``--corpus`` sharing the most words with its question (a plain
stand-in for your retriever: give the passages where you have them). Blank lines are skipped;
anything else that is not such an object is an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from blendrag.eval.metrics import normalize_answer


@dataclass(frozen=True)
class QAItem:
    """One labelled question: its gold ``answers`` and the ``passages`` it is asked over."""

    question: str
    answers: tuple[str, ...]
    passages: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError("a question must be a non-empty string")
        if not self.answers or not all(isinstance(a, str) and a.strip() for a in self.answers):
            raise ValueError("a question needs at least one non-empty gold answer")
        if not self.passages or not all(isinstance(p, str) and p.strip()
                                        for p in self.passages):
            raise ValueError("a question needs at least one non-empty passage")


def read_qa(path: Path, corpus: Sequence[str] = (), per_prompt: int = 4) -> list[QAItem]:
    """The questions of the JSON-lines file ``path`` (module docstring), in file order; lines
    without passages take them from ``corpus``. ValueError naming the line for anything
    else, and for a file without questions."""
    if not path.is_file():
        raise ValueError(f"--qa {path}: no file there")
    items = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.strip():
                items.append(_item(line, f"--qa {path} line {n}", corpus, per_prompt))
    if not items:
        raise ValueError(f"--qa {path} has no questions (one JSON object a line: question, "
                         "answer, passages)")
    return items


def _item(line: str, where: str, corpus: Sequence[str], per_prompt: int) -> QAItem:
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: not a JSON object (question, answer, passages)")
    question, answer = doc.get("question"), doc.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: no \"question\" (a non-empty string)")
    answers = [answer] if isinstance(answer, str) else answer
    if not isinstance(answers, list) or not answers or not all(
            isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f"{where}: no \"answer\" (a non-empty string, or a list of them)")
    passages = doc.get("passages")
    if passages is None:
        if not corpus:
            raise ValueError(f"{where}: no \"passages\"; give them, or --corpus to take "
                             "them from")
        passages = nearest(question, corpus, per_prompt)
    if not isinstance(passages, list) or not passages or not all(
            isinstance(p, str) and p.strip() for p in passages):
        raise ValueError(f"{where}: \"passages\" must be a list of non-empty strings")
    return QAItem(question, tuple(answers), tuple(passages))


def nearest(question: str, corpus: Sequence[str], k: int) -> list[str]:
    """The ``k`` passages of ``corpus`` sharing the most distinct words with ``question``
    (normalized as the answers are), in that order; ties keep the corpus's order."""
    words = set(normalize_answer(question).split())
    scored = sorted(range(len(corpus)),
                    key=lambda i: -len(words & set(normalize_answer(corpus[i]).split())))
    return [corpus[i] for i in scored[:k] if corpus[i].strip()]


def qa_texts(items: Sequence[QAItem]) -> list[str]:
    """The texts that identify a question set (its saved progress is named by their hash):
    each question, its answers and its passages, in order."""
    return [json.dumps([i.question, list(i.answers), list(i.passages)]) for i in items]
