"""What a calibration aims at: how close blend's whole answers must stay to full prefill's."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CalibrationTarget:
    """A ratio meets the target when, over the calibration prompts, at least ``same_answer`` of
    blend's greedy answers are full prefill's (normalized text) and the answer KL (full's
    answer teacher-forced through blend's KV, mean over prompts) is at most ``answer_kl``;
    either may be None (not asked). Answers are ``answer_tokens`` long at most, or their first
    sentence with ``first_sentence``."""

    same_answer: float | None = 0.90
    answer_kl: float | None = 0.02
    answer_tokens: int = 32
    first_sentence: bool = False

    def __post_init__(self) -> None:
        if self.same_answer is None and self.answer_kl is None:
            raise ValueError("a calibration target needs same_answer, answer_kl or both")
        if self.same_answer is not None and not (
                _number(self.same_answer) and 0.0 <= self.same_answer <= 1.0):
            raise ValueError(f"same_answer must be in [0, 1], got {self.same_answer!r}")
        if self.answer_kl is not None and not (_number(self.answer_kl) and self.answer_kl >= 0):
            raise ValueError(f"answer_kl must be a number >= 0, got {self.answer_kl!r}")
        if isinstance(self.answer_tokens, bool) or not isinstance(self.answer_tokens, int) \
                or not 1 <= self.answer_tokens <= 512:
            raise ValueError(f"answer_tokens must be an int in [1, 512], got "
                             f"{self.answer_tokens!r}")

    def met(self, same_answer: float, answer_kl: float) -> bool:
        return ((self.same_answer is None or same_answer >= self.same_answer)
                and (self.answer_kl is None or answer_kl <= self.answer_kl))

    @property
    def words(self) -> str:
        parts = []
        if self.same_answer is not None:
            parts.append(f"same answer >= {self.same_answer:.2f}")
        if self.answer_kl is not None:
            parts.append(f"answer KL <= {self.answer_kl:g}")
        span = "first sentence" if self.first_sentence else f"{self.answer_tokens} tokens"
        return " and ".join(parts) + f" (answers of {span})"


def _number(value: object) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value))
