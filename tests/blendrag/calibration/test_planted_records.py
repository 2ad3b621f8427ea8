"""A calibration record planted beside a store (a valid checksum around hostile values) is a
miss said once: no request of the default config fails on it, none runs it, and a ratio of 0.0
never turns recompute off (``blendrag.store.calibration``, ``engine/selection/calibrated.py``)."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest

from blendrag import BlendConfig, BlendEngine
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def record(engine: BlendEngine, ratio: float = 0.5) -> CalibrationRecord:
    return CalibrationRecord(engine.model_fp, engine.tokenizer_fp, "c" * 64, "epic", ratio,
                             {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32,
                              "first_sentence": False},
                             (FrontierPoint("epic", ratio, 0.95, 0.004, 2.0),), "flow", 24, 10.0)


def plant(path, **changes) -> None:
    """Rewrite the record at ``path`` with ``changes`` and a checksum that matches them."""
    outer = json.loads(path.read_text())
    body = {**outer["record"], **changes}
    text = json.dumps(body, sort_keys=True)
    outer.update(record=body, sha256=hashlib.sha256(text.encode()).hexdigest())
    path.write_text(json.dumps(outer))


@pytest.fixture
def engine_on(model_dir, tmp_path):
    stores: list[TieredKVStore] = []

    def make() -> BlendEngine:
        stores.append(TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv")))
        engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                             store=stores[-1])
        # the passages ingested: a request runs the mode the default resolves to, not a first
        # question's full prefill
        engine.ingest(PASSAGES, prefix=PREFIX)
        return engine

    yield make
    for s in stores:
        s.close()


HOSTILE = {"a string ratio": {"ratio": "0.5"}, "a NaN ratio": {"ratio": float("nan")},
           "a negative ratio": {"ratio": -0.5}, "a ratio of 0.0": {"ratio": 0.0},
           "a ratio above 1": {"ratio": 1.5}, "an unknown selector": {"selector": "nope"},
           "a text date": {"created": "yesterday"}, "a huge date": {"created": 1e300},
           "a text prompt count": {"prompts": "24"}, "a list target": {"target": []},
           "a bad frontier point": {"frontier": [{"selector": "epic", "ratio": "x",
                                                  "same_answer": 1, "answer_kl": 0,
                                                  "speedup": 1, "prompts": 1}]}}


@pytest.mark.parametrize("changes", HOSTILE.values(), ids=list(HOSTILE))
def test_a_planted_record_is_a_miss_said_once_and_no_request_fails(engine_on, changes, caplog):
    engine = engine_on()
    path = CalibrationBook.beside(engine.store.disk_dir).put(record(engine))
    plant(path, **changes)
    engine = engine_on()
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            stats = engine.prefill(layout, BlendConfig()).stats
            assert (stats.mode, stats.selector, stats.ratio) == ("blend", "preview", 0.2)
            assert stats.calibration is None
    refused = [r for r in caplog.records if r.name == "blendrag.store.calibration"]
    assert len(refused) == 1 and str(path.name) in refused[0].getMessage()
    assert engine.calibration is None


def test_a_calibration_never_chooses_nor_tries_a_ratio_of_zero():
    from blendrag.calibration.run import calibrate, choose
    from blendrag.calibration.target import CalibrationTarget

    points = [FrontierPoint("preview", 0.0, 1.0, 0.0, 9.0, 24),
              FrontierPoint("preview", 0.5, 1.0, 0.0, 2.0, 24)]
    assert choose(points, CalibrationTarget(same_answer=0.5)) == ("preview", 0.5)
    assert choose(points[:1], CalibrationTarget(same_answer=0.5)) == ("preview", None)
    for ratios in ((0.0, 0.5), (float("nan"),), (1.5,)):
        with pytest.raises(ValueError, match=r"ratios must be in \(0, 1\]"):
            calibrate(None, ["a", "b"], ratios=ratios)  # type: ignore[arg-type]


def test_a_ratio_or_selector_given_twice_is_refused():
    """Measured twice, a point would count each prompt twice: its bound on double the sample."""
    from blendrag.calibration.run import calibrate

    with pytest.raises(ValueError, match="selectors must differ"):
        calibrate(None, ["a", "b"], selectors=("preview", "preview"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ratios must differ"):
        calibrate(None, ["a", "b"], ratios=(0.3, 0.3))  # type: ignore[arg-type]
