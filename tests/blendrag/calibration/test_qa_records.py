"""A calibration record on answer quality (target kind "answer_quality", ``--qa``): kept and
read back whole, a record written before its fields still read, and a planted record with a
malformed answer-quality target or point refused (``blendrag.store.calibration``)."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from blendrag.calibration.quality import QualityTarget
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint

M, T = "m" * 64, "t" * 64


def record(ratio: float | None = 0.3) -> CalibrationRecord:
    points = (FrontierPoint("preview", 0.1, 0.4, 0.05, 4.0, 30, 0.50, -0.21),
              FrontierPoint("preview", 0.3, 0.7, 0.01, 2.5, 30, 0.67, -0.03),
              FrontierPoint("preview", 1.0, 1.0, 0.0, 1.0, 30, 0.63, 0.0))
    chosen = next((p for p in points if p.ratio == ratio), None)
    return CalibrationRecord(M, T, "c" * 64, "preview", ratio,
                             QualityTarget(margin=0.05).record(30, 0.63, chosen), points,
                             "flow words", 30, 80.0, created=time.time())


def plant(path, **changes) -> None:
    """Rewrite the record at ``path`` with ``changes`` and a checksum that matches them."""
    outer = json.loads(path.read_text())
    body = {**outer["record"], **changes}
    outer.update(record=body, sha256=hashlib.sha256(
        json.dumps(body, sort_keys=True).encode()).hexdigest())
    path.write_text(json.dumps(outer))


def test_an_answer_quality_record_round_trips_and_says_its_target(tmp_path):
    kept = record()
    CalibrationBook.beside(tmp_path).put(kept)
    again = CalibrationBook.beside(tmp_path).latest(M, T)
    assert again == kept
    assert again.target["kind"] == "answer_quality" and again.target["bound"] == -0.03
    assert again.point().quality == 0.67 and again.summary()["target"]["full_quality"] == 0.63
    none = record(ratio=None)  # no ratio met it: no quality, no bound
    assert (none.target["quality"], none.target["bound"]) == (None, None)


def test_a_record_written_before_the_quality_fields_is_still_read(tmp_path):
    path = CalibrationBook.beside(tmp_path).put(record())
    outer = json.loads(path.read_text())
    plant(path, frontier=[{k: v for k, v in p.items() if k not in ("quality", "quality_bound")}
                          for p in outer["record"]["frontier"]])
    again = CalibrationBook.beside(tmp_path).latest(M, T)
    assert again is not None and again.point().quality is None


BAD_TARGETS = {
    "an unknown kind": {"kind": "answer_qualty"},
    "a margin above 1": {"margin": 1.5},
    "a text margin": {"margin": "0.05"},
    "a confidence of 1": {"confidence": 1.0},
    "an unknown metric": {"metric": "bleu"},
    "a NaN full quality": {"full_quality": float("nan")},
    "a quality above 1": {"quality": 1.2},
    "a bound without a quality": {"quality": None},
    "an infinite bound": {"bound": float("-inf")},
    "a bound above 1": {"bound": 1.5},
    "no questions": {"questions": 0},
    "a boolean answer length": {"answer_tokens": True},
}


@pytest.mark.parametrize("change", BAD_TARGETS.values(), ids=list(BAD_TARGETS))
def test_a_planted_malformed_quality_target_is_refused(tmp_path, change):
    path = CalibrationBook.beside(tmp_path).put(record())
    plant(path, target={**record().target, **change})
    reader = CalibrationBook.beside(tmp_path)
    assert reader.latest(M, T) is None
    assert len(reader.refused) == 1 and "target" in reader.refused[0][1]


@pytest.mark.parametrize("change", [{"extra": 1}, {"kind": None}])
def test_a_quality_target_with_other_fields_is_refused(tmp_path, change):
    path = CalibrationBook.beside(tmp_path).put(record())
    target = {**record().target, **change}
    plant(path, target=target)
    assert CalibrationBook.beside(tmp_path).latest(M, T) is None


@pytest.mark.parametrize("point", [{"quality": 1.5}, {"quality": "0.6"},
                                   {"quality_bound": float("nan")}, {"quality_bound": 2.0},
                                   {"unknown": 1}])
def test_a_planted_malformed_quality_point_is_refused(tmp_path, point):
    path = CalibrationBook.beside(tmp_path).put(record())
    outer = json.loads(path.read_text())
    points = outer["record"]["frontier"]
    plant(path, frontier=[{**points[0], **point}, *points[1:]])
    assert CalibrationBook.beside(tmp_path).latest(M, T) is None
