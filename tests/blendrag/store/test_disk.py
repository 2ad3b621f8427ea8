"""Disk tier: hard byte budget with LRU eviction, defective files are logged misses, no pickle."""

from __future__ import annotations

import logging
from pathlib import Path

import diskcache
import pytest

from blendrag.store import DiskTier, encode
from helpers.kvgen import entry_bytes, make_kv, same_bits

KV_ARGS = dict(layers=2, heads=2, tokens=64, dim=32)  # ~66 KiB per entry


def _val_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*.val")]


def _disk_only(make_store, budget: int):
    return make_store(ram_bytes=0, disk_bytes=budget)


def test_budget_is_never_exceeded_and_lru_order_is_respected(make_store, tmp_path):
    size = entry_bytes(**KV_ARGS)
    budget = 4 * size + (48 << 10)  # four entries plus the SQLite index
    store = _disk_only(make_store, budget)
    for i in range(4):
        store.put(f"k{i}", make_kv(i, **KV_ARGS))
    assert store.stats().tier("disk").entries == 4
    assert store.get("k0") is not None  # k0 becomes most recent: k1 is now the LRU entry
    store.put("k4", make_kv(4, **KV_ARGS))
    assert [store.contains(f"k{i}") for i in range(5)] == [True, False, True, True, True]
    store.get("k2")
    store.put("k5", make_kv(5, **KV_ARGS))
    assert [store.contains(f"k{i}") for i in range(6)] == [True, False, True, False, True, True]
    for i in range(6, 30):  # churn, with reads mixed in
        store.put(f"k{i}", make_kv(i, **KV_ARGS))
        store.get(f"k{i - 3}")
        usage = store.stats().tier("disk")
        assert usage.used_bytes <= budget
        assert sum(p.stat().st_size for p in _val_files(tmp_path / "kv")) <= budget
    assert len(_val_files(tmp_path / "kv")) == store.stats().tier("disk").entries


def test_entry_larger_than_the_budget_is_not_stored(make_store):
    store = _disk_only(make_store, 64 << 10)
    store.put("big", make_kv(1, **KV_ARGS))
    assert not store.contains("big") and store.stats().tier("disk").entries == 0


def _corrupt_file(path: Path, how: str, other: bytes) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif how == "bit-flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0x40]) + data[-9:])
    elif how == "foreign-entry":
        path.write_bytes(other)  # a valid entry, but of another key
    elif how == "garbage":
        path.write_bytes(b"not a safetensors file at all")
    elif how == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "bit-flip", "foreign-entry", "garbage", "empty"])
def test_defective_file_is_a_logged_miss_and_is_dropped(make_store, how, caplog):
    store = _disk_only(make_store, 4 << 20)
    kv = make_kv(1)
    store.put("k", kv)
    path = DiskTier(store.config.disk_dir, None).entry_path("k")
    _corrupt_file(path, how, encode("other", make_kv(2)))
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("k") is None
    assert any("unusable" in r.getMessage() for r in caplog.records)
    s = store.stats().tier("disk")
    assert (s.corrupt, s.misses, s.hits) == (1, 1, 0)
    assert not store.contains("k")  # dropped, so the engine recomputes and re-stores it
    store.put("k", kv)
    assert same_bits(store.get("k"), kv)


def test_pickled_rows_are_never_unpickled(make_store, tmp_path, caplog):
    store = _disk_only(make_store, 4 << 20)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    # Someone with write access plants pickled values (inline and as a file) in the directory.
    planted = diskcache.Cache(str(tmp_path / "kv"))
    planted.set("inline", Exploit())
    planted.set("as-file", [Exploit()] + [b"x" * 100_000])
    planted.close()
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("inline") is None and store.get("as-file") is None
    assert not marker.exists()
    assert sum("refused" in r.getMessage() for r in caplog.records) == 2


def test_disk_tier_rejects_non_bytes_values(tmp_path):
    tier = DiskTier(tmp_path / "kv", 1 << 20)
    with pytest.raises(TypeError):
        tier.open().set("k", {"not": "bytes"})
    tier.close()


@pytest.mark.parametrize("value", [12345, 1.5, "text"])
def test_a_planted_index_row_of_another_type_is_a_miss(make_store, tmp_path, value, caplog):
    """diskcache keeps ints, floats and strings in its index as they are: a row planted with
    plain diskcache calls is refused like a pickled one, never handed to the reader."""
    store = _disk_only(make_store, 4 << 20)
    planted = diskcache.Cache(str(tmp_path / "kv"))
    planted.set("planted", value)
    planted.close()
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("planted") is None and store.open_layers("planted") is None
    assert any("refused" in r.getMessage() for r in caplog.records)
    store.put("planted", make_kv(3))
    assert same_bits(store.get("planted"), make_kv(3))
