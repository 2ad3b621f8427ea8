"""The answer-quality target's statistic and choice on constructed score tables
(``blendrag.calibration.quality``): the paired one-sided t bound, the smallest ratio within the
margin, a refusal when the bound fails, and the target's validation."""

from __future__ import annotations

import math

import pytest

from blendrag.calibration.quality import (
    QualityTarget,
    choose_quality,
    paired_bound,
    t_quantile,
)
from blendrag.store.calibration import FrontierPoint


@pytest.mark.parametrize("p,df,exact", [(0.9, 1, 3.0777), (0.9, 2, 1.8856), (0.9, 3, 1.6377),
                                        (0.9, 9, 1.3830), (0.9, 29, 1.3114),
                                        (0.95, 4, 2.1318), (0.95, 29, 1.6991),
                                        (0.8, 29, 0.8542)])
def test_t_quantiles_match_the_tables(p, df, exact):
    assert t_quantile(p, df) == pytest.approx(exact, abs=1e-3)


def test_the_paired_bound_is_the_mean_difference_less_t_standard_errors():
    full = [1, 0, 1, 1, 0, 1, 0, 1, 1, 0]
    blend = [1, 0, 0, 1, 1, 1, 0, 1, 0, 0]  # diffs: 0 0 -1 0 1 0 0 0 -1 0
    diffs = [b - f for f, b in zip(full, blend)]
    mean = sum(diffs) / 10  # -0.1
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 9)
    expected = mean - 1.3830 * sd / math.sqrt(10)
    assert paired_bound(full, blend, 0.9) == pytest.approx(expected, abs=1e-3)
    assert expected == pytest.approx(-0.348, abs=1e-3)  # sd 0.568, 10 questions
    assert paired_bound(full, full, 0.9) == 0.0  # no spread: the mean itself
    assert paired_bound([1.0], [0.0], 0.9) is None  # one question: no spread to measure
    with pytest.raises(ValueError, match="as many"):
        paired_bound([1.0, 0.0], [1.0], 0.9)


def _point(ratio: float, bound: float | None, speedup: float = 1.0,
           selector: str = "preview") -> FrontierPoint:
    return FrontierPoint(selector, ratio, 0.5, 0.01, speedup, 30, 0.6, bound)


def test_the_smallest_ratio_within_the_margin_is_chosen():
    target = QualityTarget(margin=0.05)
    points = [_point(0.1, -0.20, 4.0), _point(0.3, -0.04, 2.0), _point(0.5, -0.01, 1.5),
              _point(1.0, 0.0, 1.0)]
    assert choose_quality(points, target).ratio == 0.3
    assert choose_quality(points, QualityTarget(margin=0.25)).ratio == 0.1
    assert choose_quality(points, QualityTarget(margin=0.0)).ratio == 1.0  # exact only
    # another selector's smallest ratio within the margin is faster: it wins
    epic = [_point(0.2, -0.03, 3.0, "epic")]
    assert (choose_quality(points + epic, target).selector, choose_quality(
        points + epic, target).ratio) == ("epic", 0.2)


def test_no_ratio_is_chosen_when_every_bound_fails_or_is_missing():
    target = QualityTarget(margin=0.05)
    assert choose_quality([_point(0.3, -0.06), _point(0.5, -0.051)], target) is None
    assert choose_quality([_point(0.3, None)], target) is None  # too few questions: no bound
    assert choose_quality([FrontierPoint("preview", 0.0, 1, 0, 9, 30, 0.9, 0.5)],
                          target) is None  # ratio 0 recomputes nothing: never chosen


@pytest.mark.parametrize("kwargs,match", [
    ({"margin": -0.01}, "margin"), ({"margin": 1.5}, "margin"),
    ({"margin": float("nan")}, "margin"), ({"margin": True}, "margin"),
    ({"confidence": 1.0}, "confidence"), ({"confidence": 0.3}, "confidence"),
    ({"metric": "bleu"}, "metric"), ({"answer_tokens": 0}, "answer_tokens")])
def test_a_bad_target_is_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QualityTarget(**kwargs)


def test_the_target_as_a_record_keeps_it():
    target = QualityTarget(margin=0.1, confidence=0.95, metric="qa_f1", answer_tokens=16)
    chosen = _point(0.3, -0.04)
    assert target.record(30, 0.63, chosen) == {
        "kind": "answer_quality", "margin": 0.1, "confidence": 0.95, "metric": "qa_f1",
        "answer_tokens": 16, "questions": 30, "full_quality": 0.63, "quality": 0.6,
        "bound": -0.04}
    assert target.record(30, 0.63, None)["quality"] is None
