"""The calibration's prompts, made from the user's own passages: a few passages in a random
order, then a question. Labels are not needed: blend's answer is compared with full prefill's
on the same prompt, whatever the question.

Questions come from a small fixed set of generic instructions that any passages answer
(``GENERIC``), or from the model itself (``model_questions``): it reads one of the prompt's
passages and writes a question about it, which makes the calibration ask what the user's
readers would ask of that text (a chat model is needed: its template frames the request).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GENERIC = (
    "What is the first passage about? Answer in one sentence.",
    "Name one person, place or organisation that the passages mention, and say what they say "
    "about it.",
    "Which passage gives a date or a number, and what is it?",
    "Summarize the last passage in one sentence.",
    "What do the first and the last passage have in common?",
    "Quote the most important fact in the second passage.",
    "Which passage is the longest, and what is it about?",
    "What question does the third passage answer?",
)


@dataclass(frozen=True)
class CalibrationPrompt:
    """``passages`` (as the application retrieves them, in the prompt's order) and the
    ``question`` asked of them."""

    passages: tuple[str, ...]
    question: str


def check_corpus(passages: Sequence[str], per_prompt: int = 4) -> list[str]:
    """The passages with text; ValueError when they are too few for prompts of ``per_prompt``
    (what a job that calibrates after ingesting checks before it starts)."""
    if per_prompt < 1:
        raise ValueError(f"per_prompt must be >= 1, got {per_prompt}")
    texts = [p for p in passages if p.strip()]
    if len(texts) < max(2, per_prompt):
        raise ValueError(f"calibration needs at least {max(2, per_prompt)} passages with text "
                         f"(prompts of {per_prompt} passages); the corpus has {len(texts)}")
    return texts


def make_prompts(passages: Sequence[str], count: int, per_prompt: int = 4, seed: int = 0,
                 ask: Callable[[str], str] | None = None) -> list[CalibrationPrompt]:
    """``count`` prompts of ``per_prompt`` passages each, drawn without replacement within a
    prompt and in a random order; a generic question each, in turn, or ``ask(passage)``'s
    question about one of them. ValueError when there are too few passages."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    texts = check_corpus(passages, per_prompt)
    rng = random.Random(seed)
    out = []
    for i in range(count):
        chosen = tuple(rng.sample(texts, per_prompt))
        question = GENERIC[i % len(GENERIC)] if ask is None else ask(rng.choice(chosen))
        out.append(CalibrationPrompt(chosen, question))
    return out


def split_half(passages: Sequence[str], seed: int = 0) -> tuple[list[str], list[str]]:
    """The passages in two halves at random (calibrate on one, check on the other)."""
    order = list(passages)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return order[:half], order[half:]
