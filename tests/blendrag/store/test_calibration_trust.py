"""Calibration records are read as untrusted bytes (``blendrag.store.calibration``): each field
checked, a record signed where the store has keys, kept per namespace and shared only through
the store's public namespace; a bad record is a miss said once, never an exception."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import pytest

from blendrag.config import SELECTORS
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.auth import StoreKeys
from blendrag.store.calibration import CalibrationBook, CalibrationRecord, FrontierPoint
from blendrag.store.calibration_checks import MAX_BYTES
from blendrag.store.names import Names

KEYS = StoreKeys({"k1": b"deployment-secret-0123456789"}, "k1")
OTHER = StoreKeys({"k1": b"an-attackers-own-secret-012345"}, "k1")  # the right id, wrong key
M, T = "m" * 64, "t" * 64


def record(ratio: float | None = 0.3, model: str = M, created: float = 1000.0,
           corpus: str = "c" * 64) -> CalibrationRecord:
    return CalibrationRecord(model, T, corpus, "preview", ratio,
                             {"same_answer": 0.9, "answer_kl": 0.02, "answer_tokens": 32,
                              "first_sentence": False},
                             (FrontierPoint("preview", 0.3, 0.92, 0.01, 2.5, 24),),
                             "flow words", 24, 12.5, created=created)


def replant(path, **changes) -> None:
    """Rewrite the record at ``path`` with ``changes``, its checksum made to match."""
    outer = json.loads(path.read_text())
    body = {**outer["record"], **changes}
    for k in [k for k, v in changes.items() if v is ...]:
        del body[k]
    outer.update(record=body, sha256=hashlib.sha256(json.dumps(body, sort_keys=True).encode())
                 .hexdigest())
    path.write_text(json.dumps(outer))


def point(**changes) -> dict:
    return {"selector": "preview", "ratio": 0.3, "same_answer": 0.9, "answer_kl": 0.0,
            "speedup": 2.0, "prompts": 24, **changes}


BAD_FIELDS = {
    "ratio 0.0": ({"ratio": 0.0}, "ratio"), "ratio NaN": ({"ratio": float("nan")}, "ratio"),
    "ratio -1": ({"ratio": -1}, "ratio"), "ratio 1.01": ({"ratio": 1.01}, "ratio"),
    "ratio text": ({"ratio": "0.3"}, "ratio"), "ratio true": ({"ratio": True}, "ratio"),
    "ratio infinite": ({"ratio": float("inf")}, "ratio"),
    "ratio a huge integer": ({"ratio": 10 ** 400}, "OverflowError"),
    "selector number": ({"selector": 3}, "selector"), "selector empty": ({"selector": ""},
                                                                         "selector"),
    "model list": ({"model": ["m"]}, "model"), "model huge": ({"model": "m" * 10_000}, "model"),
    "date text": ({"created": "yesterday"}, "created"),
    "date NaN": ({"created": float("nan")}, "created"),
    "date in the future": ({"created": time.time() + 30 * 86_400}, "future"),
    "date left out": ({"created": ...}, "fields"),
    "date negative": ({"created": -5.0}, "created"),
    "prompts text": ({"prompts": "24"}, "prompts"), "prompts 0": ({"prompts": 0}, "prompts"),
    "prompts float": ({"prompts": 24.0}, "prompts"),
    "seconds NaN": ({"seconds": float("nan")}, "seconds"),
    "flow number": ({"flow": 1}, "flow"),
    "target list": ({"target": []}, "target"),
    "target of nothing": ({"target": {"same_answer": None, "answer_kl": None,
                                      "answer_tokens": 32, "first_sentence": False}}, "target"),
    "target share 2": ({"target": {"same_answer": 2, "answer_kl": None, "answer_tokens": 32,
                                   "first_sentence": False}}, "same_answer"),
    "frontier empty": ({"frontier": []}, "frontier"),
    "frontier text": ({"frontier": "x"}, "frontier"),
    "frontier ratio text": ({"frontier": [point(ratio="x")]}, "ratio"),
    "frontier share NaN": ({"frontier": [point(same_answer=float("nan"))]}, "same_answer"),
    "frontier KL negative": ({"frontier": [point(answer_kl=-1)]}, "answer_kl"),
    "frontier extra field": ({"frontier": [point(evil=1)]}, "fields"),
    "extra field": ({"evil": 1}, "fields"),
}


@pytest.mark.parametrize("changes,named", BAD_FIELDS.values(), ids=list(BAD_FIELDS))
def test_each_field_is_checked_and_a_bad_one_is_a_miss_said_once(tmp_path, caplog, changes,
                                                                 named):
    path = CalibrationBook.beside(tmp_path).put(record())
    replant(path, **changes)
    with pytest.raises(ValueError, match=named):
        CalibrationRecord.from_json(path.read_text())
    with caplog.at_level(logging.WARNING, logger="blendrag.store.calibration"):
        for _ in range(3):  # three readers (requests, engines): one warning
            book = CalibrationBook.beside(tmp_path)
            assert book.latest(M, T) is None and book.records() == []
            assert [name for name, _ in book.refused] == [path.name]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and path.name in said[0] and "not used" in said[0]


def test_a_selector_outside_the_registry_is_refused_where_the_reader_names_them(tmp_path):
    path = CalibrationBook.beside(tmp_path).put(record())
    replant(path, selector="nope")
    assert CalibrationBook.beside(tmp_path).latest(M, T).selector == "nope"  # any name
    book = CalibrationBook.beside(tmp_path, selectors=SELECTORS)
    assert book.latest(M, T) is None and "unknown selector 'nope'" in book.refused[0][1]


def test_a_record_keeps_a_ratio_in_0_1_and_refuses_zero_when_made():
    for bad in (0.0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"ratio must be None or in \(0, 1\]"):
            record(ratio=bad)
    assert record(ratio=1.0).ratio == 1.0 and record(ratio=None).ratio is None


@pytest.mark.parametrize("kind", ["too large", "link", "fifo", "folder", "not utf-8",
                                  "deep JSON", "JSON list"])
def test_files_that_are_not_records_are_refused_without_blocking_or_raising(tmp_path, kind):
    good = CalibrationBook.beside(tmp_path).put(record(model="g" * 64))
    folder = good.parent
    bad = folder / "x.json"
    if kind == "too large":
        bad.write_bytes(b" " * (MAX_BYTES + 1))
    elif kind == "link":
        bad.symlink_to(good)
    elif kind == "fifo":
        os.mkfifo(bad)  # reading it would block forever
    elif kind == "folder":
        bad.mkdir()
    elif kind == "not utf-8":
        bad.write_bytes(b"\xff\xfe" * 10)
    elif kind == "deep JSON":
        bad.write_text("[" * 100_000 + "]" * 100_000)
    else:
        bad.write_text("[]")
    book = CalibrationBook.beside(tmp_path)
    assert [r.model for r in book.records()] == ["g" * 64]
    assert [name for name, _ in book.refused] == ["x.json"]


def test_a_folder_this_process_cannot_search_is_refused_not_raised(tmp_path, monkeypatch):
    """Path.is_dir raises on EACCES (a folder made by another user): a request reads the
    records, so the folder is refused like an unreadable file, never raised."""
    from pathlib import Path

    folder = CalibrationBook.beside(tmp_path).put(record()).parent
    is_dir = Path.is_dir

    def denied(path, *args, **kw):
        if path == folder:
            raise PermissionError(13, "Permission denied", str(path))
        return is_dir(path, *args, **kw)

    monkeypatch.setattr(Path, "is_dir", denied)
    book = CalibrationBook.beside(tmp_path)
    assert book.records() == [] and len(book.refused) == 1


def test_a_record_being_written_is_not_read(tmp_path):
    """'.tmp-*.json' is a record another process is writing (or a killed writer left): not a
    damaged record."""
    folder = CalibrationBook.beside(tmp_path).put(record()).parent
    (folder / ".tmp-abc.json").write_text("{")  # half written
    book = CalibrationBook.beside(tmp_path)
    assert len(book.records()) == 1 and book.refused == []


# ---- signed records ------------------------------------------------------------------

def test_with_keys_a_record_is_signed_and_a_forged_or_unsigned_one_refused(tmp_path):
    names = Names("acme", KEYS)
    book = CalibrationBook.beside(tmp_path, names)
    path = book.put(record())
    assert path.parent == tmp_path / "calibrations" / names.ns_id
    assert json.loads(path.read_text())["auth"].startswith("k1:")
    assert CalibrationBook.beside(tmp_path, names).latest(M, T) == record()
    valid = path.read_text()
    replant(path, ratio=1.0)  # checksum fixed, tag not: a forgery
    reader = CalibrationBook.beside(tmp_path, names)
    assert reader.latest(M, T) is None and "tag mismatch" in reader.refused[0][1]
    path.write_text(record(ratio=1.0).to_json())  # an unsigned record
    reader = CalibrationBook.beside(tmp_path, names)
    assert reader.latest(M, T) is None and "unsigned" in reader.refused[0][1]
    # signed with the attacker's own key under the right key id, for the right namespace
    CalibrationBook(path.parent, keys=OTHER, ns_id=names.ns_id).put(record(ratio=1.0))
    reader = CalibrationBook.beside(tmp_path, names)
    assert reader.latest(M, T) is None and "tag mismatch" in reader.refused[0][1]
    path.write_text(valid)
    assert CalibrationBook.beside(tmp_path, Names("acme", KEYS)).latest(M, T) == record()


def test_a_signed_record_copied_into_another_namespace_or_renamed_does_not_verify(tmp_path):
    a, b = Names("acme", KEYS), Names("globex", KEYS)
    path = CalibrationBook.beside(tmp_path, a).put(record())
    CalibrationBook.beside(tmp_path, b).put(record(model="x" * 64))  # makes b's folder
    copied = tmp_path / "calibrations" / b.ns_id / path.name
    copied.write_bytes(path.read_bytes())
    reader = CalibrationBook.beside(tmp_path, b)
    assert reader.latest(M, T) is None and "tag mismatch" in reader.refused[0][1]
    other = CalibrationBook.beside(tmp_path, a).put(record(corpus="d" * 64))
    other.write_bytes(path.read_bytes())  # a's own record under another record's name
    assert CalibrationBook.beside(tmp_path, a).records() == [record()]


def test_keys_rotate_and_a_retired_key_is_refused(tmp_path):
    old = StoreKeys({"k0": b"old-secret-0123456789abcdef"}, "k0")
    path = CalibrationBook.beside(tmp_path, Names("", old)).put(record())
    rotated = StoreKeys({"k0": b"old-secret-0123456789abcdef",
                         "k1": b"new-secret-0123456789abcdef"}, "k1", naming="k0")
    assert CalibrationBook.beside(tmp_path, Names("", rotated)).latest(M, T) == record()
    # the naming secret kept under another id: the same namespace id, the same folder
    retired = StoreKeys({"names": b"old-secret-0123456789abcdef",
                         "k1": b"new-secret-0123456789abcdef"}, "k1", naming="names",
                        retired=("k0",))
    assert Names("", retired).ns_id == Names("", old).ns_id and path.exists()
    reader = CalibrationBook.beside(tmp_path, Names("", retired))
    assert reader.records() == [] and "retired" in reader.refused[0][1]


# ---- namespaces ----------------------------------------------------------------------

@pytest.mark.parametrize("keys", [None, KEYS], ids=["plain", "keyed"])
def test_records_are_per_namespace_and_shared_only_through_the_public_one(tmp_path, keys):
    def store(namespace: str, public: str | None = None) -> TieredKVStore:
        return TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path, namespace=namespace,
                                         public_namespace=public, auth_key=keys))

    with store("acme") as acme, store("globex") as globex, store("") as default:
        CalibrationBook.of_store(acme).put(record(ratio=0.3))
        assert CalibrationBook.of_store(acme).latest(M, T).ratio == 0.3
        assert CalibrationBook.of_store(globex).latest(M, T) is None
        assert CalibrationBook.of_store(default).latest(M, T) is None
        assert CalibrationBook.of_store(acme.namespaced("globex")).latest(M, T) is None
        CalibrationBook.of_store(store("shared")).put(record(ratio=1.0, created=2000.0))
        with store("globex", public="shared") as opted, store("acme", public="shared") as own:
            assert CalibrationBook.of_store(opted).latest(M, T).ratio == 1.0
            assert CalibrationBook.of_store(own).latest(M, T).ratio == 0.3  # its own first
        assert CalibrationBook.of_store(globex).latest(M, T) is None  # did not opt in


def test_the_default_namespace_without_keys_keeps_the_folder_it_always_had(tmp_path):
    with TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path)) as store:
        path = CalibrationBook.of_store(store).put(record())
    assert path.parent == tmp_path / "calibrations"
    assert CalibrationBook.beside(tmp_path).latest(M, T) == record()


def test_records_are_never_written_through_a_planted_link(tmp_path):
    from blendrag.store.calibration import CalibrationBook

    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "kv").mkdir()
    (tmp_path / "kv" / "calibrations").symlink_to(outside)
    book = CalibrationBook.beside(tmp_path / "kv")
    with pytest.raises(ValueError, match="symbolic link"):
        book.put(record())
    assert list(outside.iterdir()) == []
