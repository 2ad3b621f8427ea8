"""Calibration records beside a store: kept whole, read back, never another model's, a damaged
one a miss with a warning (``blendrag.store.calibration``)."""

from __future__ import annotations

import logging
import time

import pytest

from blendrag.store.calibration import (
    CalibrationBook,
    CalibrationRecord,
    FrontierPoint,
    corpus_id,
)


def record(model: str = "m" * 64, tokenizer: str = "t" * 64, corpus: str = "c" * 64,
           ratio: float | None = 0.3, created: float | None = None) -> CalibrationRecord:
    points = (FrontierPoint("preview", 0.1, 0.5, 0.05, 4.0),
              FrontierPoint("preview", 0.3, 0.92, 0.01, 2.5))
    return CalibrationRecord(model, tokenizer, corpus, "preview", ratio,
                             {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32,
                              "first_sentence": False}, points, "flow words", 24, 12.5,
                             created=time.time() if created is None else created)


def test_a_record_round_trips_through_its_file(tmp_path):
    book = CalibrationBook.beside(tmp_path)
    kept = record()
    path = book.put(kept)
    assert path is not None and path.parent == tmp_path / "calibrations"
    again = CalibrationBook.beside(tmp_path).latest("m" * 64, "t" * 64)
    assert again == kept
    assert again.point() == FrontierPoint("preview", 0.3, 0.92, 0.01, 2.5)
    assert again.summary()["same_answer"] == 0.92 and again.summary()["ratio"] == 0.3


def test_the_latest_record_of_this_model_and_tokenizer_only(tmp_path):
    book = CalibrationBook.beside(tmp_path)
    book.put(record(corpus="a" * 64, ratio=0.5, created=100.0))
    book.put(record(corpus="b" * 64, ratio=0.2, created=200.0))
    book.put(record(model="x" * 64, ratio=0.9, created=300.0))  # another model's
    book.put(record(tokenizer="y" * 64, ratio=0.9, created=300.0))  # another tokenizer's
    reader = CalibrationBook.beside(tmp_path)
    assert reader.latest("m" * 64, "t" * 64).ratio == 0.2
    assert reader.latest("z" * 64, "t" * 64) is None
    book.put(record(corpus="a" * 64, ratio=0.7, created=400.0))  # the same corpus replaced
    assert len(reader.records()) == 4 and reader.latest("m" * 64, "t" * 64).ratio == 0.7


def test_a_damaged_or_renamed_record_is_a_miss_said_once(tmp_path, caplog):
    book = CalibrationBook.beside(tmp_path)
    path = book.put(record())
    text = path.read_text()
    path.write_text(text.replace('"ratio": 0.3', '"ratio": 0.1'))  # content changed
    reader = CalibrationBook.beside(tmp_path)
    with caplog.at_level(logging.WARNING, logger="blendrag.store.calibration"):
        assert reader.latest("m" * 64, "t" * 64) is None
        assert reader.latest("m" * 64, "t" * 64) is None
    assert sum("damaged" in r.message for r in caplog.records) == 1
    path.write_text(text[: len(text) // 2])  # cut short
    assert CalibrationBook.beside(tmp_path).records() == []
    path.write_text(text)
    other = book.put(record(model="x" * 64))
    other.write_text(text)  # a valid record under another record's name
    assert [r.model for r in CalibrationBook.beside(tmp_path).records()] == ["m" * 64]


def test_a_store_without_a_disk_tier_keeps_records_in_memory():
    book = CalibrationBook.beside(None)
    assert book.put(record()) is None
    assert book.latest("m" * 64, "t" * 64) == record(created=book.records()[0].created)


def test_the_corpus_id_follows_the_texts_and_their_order():
    assert corpus_id(["a", "b"]) == corpus_id(["a", "b"])
    assert corpus_id(["a", "b"]) != corpus_id(["b", "a"])
    assert corpus_id(["ab"]) != corpus_id(["a", "b"])


def test_a_record_that_is_not_one_is_refused_by_name():
    with pytest.raises(ValueError, match="not a calibration record"):
        CalibrationRecord.from_json('{"format": 1}')
    with pytest.raises(ValueError, match="checksum or format"):
        CalibrationRecord.from_json('{"format": 2, "sha256": "", "record": {}}')
