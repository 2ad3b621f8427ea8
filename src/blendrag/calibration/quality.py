"""The answer-quality target (``blendrag calibrate --qa``): blend's answers may score a little
below full prefill's against the gold answers, by at most a stated margin, at a stated
confidence.

Per question, full prefill's answer and each ratio's get a quality score against the gold
answers, with the measure ``blendrag bench quality`` uses (``blendrag.eval.metrics``:
``contains``, ``qa_f1`` or ``rouge_l``). The statistic is the *paired* difference ``d_i =
q_ratio_i - q_full_i`` over the same questions: what each question's answer lost or gained.
A ratio meets the target when the one-sided lower confidence bound of the mean difference,
``mean(d) - t(confidence, n - 1) * sd(d) / sqrt(n)`` (Student's t on the paired differences),
is at least ``-margin``: on questions not seen, its mean quality is at least full's less the
margin, at that confidence, as far as a normal approximation of the mean says.

A bound needs two questions at least. Where blend's answers score exactly as full's on every
question the differences have no spread and the bound is their mean, 0: a claim a handful of
questions cannot carry, which is why the command asks for ``MIN_QUESTIONS``.
Ratio 1.0 is a full prefill's rows (exact): it meets any margin.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from blendrag.checks import is_finite_number
from blendrag.eval.metrics import METRICS
from blendrag.store.calibration import FrontierPoint
from blendrag.store.calibration_checks import QUALITY_KIND

MIN_QUESTIONS = 10  # fewer: a bound on a spread measured over a handful says little


@dataclass(frozen=True)
class QualityTarget:
    """A ratio's mean answer quality (``metric``, answers of ``answer_tokens`` tokens) at most
    ``margin`` below full prefill's, at its one-sided ``confidence`` bound (module
    docstring)."""

    margin: float = 0.05
    confidence: float = 0.90
    metric: str = "contains"
    answer_tokens: int = 32

    def __post_init__(self) -> None:
        if not (is_finite_number(self.margin) and 0.0 <= self.margin <= 1.0):
            raise ValueError(f"margin must be in [0, 1] (a quality is in [0, 1]), got "
                             f"{self.margin!r}")
        if not (is_finite_number(self.confidence) and 0.5 <= self.confidence < 1.0):
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got "
                             f"{self.metric!r}")
        if isinstance(self.answer_tokens, bool) or not isinstance(self.answer_tokens, int) \
                or not 1 <= self.answer_tokens <= 512:
            raise ValueError(f"answer_tokens must be an int in [1, 512], got "
                             f"{self.answer_tokens!r}")

    def met(self, bound: float | None) -> bool:
        """Whether a ratio whose difference from full has lower bound ``bound`` meets it."""
        return bound is not None and bound >= -self.margin

    @property
    def words(self) -> str:
        return (f"answer quality ({self.metric}) at most {self.margin:g} below full prefill's "
                f"at its {self.confidence:.0%} bound (answers of {self.answer_tokens} tokens)")

    def record(self, questions: int, full_quality: float,
               chosen: FrontierPoint | None) -> dict:
        """The record's ``target``: this target, what full prefill scored on ``questions``
        questions, and the chosen point's quality and bound (None: none met it)."""
        return {"kind": QUALITY_KIND, "margin": self.margin, "confidence": self.confidence,
                "metric": self.metric, "answer_tokens": self.answer_tokens,
                "questions": questions, "full_quality": full_quality,
                "quality": None if chosen is None else chosen.quality,
                "bound": None if chosen is None else chosen.quality_bound}


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile ``p`` (in (0, 1)) with ``df`` degrees of freedom: exact for 1 and
    2, else the Cornish-Fisher expansion from the normal quantile (Abramowitz and Stegun
    26.7.5: within 0.001 of the exact value for df >= 3 at 0.9 and 0.95, 0.02 at 0.99)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def paired_bound(full: Sequence[float], blend: Sequence[float],
                 confidence: float) -> float | None:
    """The one-sided lower ``confidence`` bound of mean(blend - full) over paired questions;
    None with fewer than two questions (no spread to measure)."""
    if len(full) != len(blend):
        raise ValueError(f"paired scores need as many of each, got {len(full)} and "
                         f"{len(blend)}")
    if len(full) < 2:
        return None
    diffs = [b - f for f, b in zip(full, blend, strict=True)]
    spread = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return statistics.mean(diffs) - t_quantile(confidence, len(diffs) - 1) * spread


def choose_quality(points: Sequence[FrontierPoint],
                   target: QualityTarget) -> FrontierPoint | None:
    """Per selector the smallest ratio meeting ``target`` (ratio 1.0: exact, always); of
    those the fastest (then the smaller ratio); None when none does."""
    best: FrontierPoint | None = None
    for selector in dict.fromkeys(p.selector for p in points):
        met = [p for p in points if p.selector == selector and p.ratio > 0
               and (p.ratio >= 1.0 or target.met(p.quality_bound))]
        if not met:
            continue
        smallest = min(met, key=lambda p: p.ratio)
        if best is None or (smallest.speedup, -smallest.ratio) > (best.speedup, -best.ratio):
            best = smallest
    return best
