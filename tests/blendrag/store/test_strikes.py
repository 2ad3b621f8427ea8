"""Failures that say nothing about an entry's bytes (an I/O error, a permission, a read that a
fresh read contradicts) are misses and strikes against the tier: the entry stays, and three in
a row bench the tier; a success clears them; an unusable tier is benched at once."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3

import diskcache
import pytest
import torch

from blendrag.store import DiskTier, disk_files, readers
from blendrag.store.errors import EntryError
from blendrag.store.health import STRIKES, TierHealth
from blendrag.store.layered import LayerReadError
from blendrag.store.wrappers import TierWrapper
from helpers.files import entry_digests
from helpers.kvgen import make_kv, same_bits


def test_strikes_bench_after_three_in_a_row_and_a_success_clears_them(caplog):
    health = TierHealth("test tier", retry_after_s=3600)
    failure = OSError(errno.EIO, "Input/output error")
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        health.failed("read", failure, at_once=False)
        health.failed("read", failure, at_once=False)
        health.succeeded()
        health.failed("read", failure, at_once=False)
        health.failed("read", failure, at_once=False)
        assert health.available and health.failures == 2
        health.failed("read", failure, at_once=False)
    assert not health.available and STRIKES == 3
    assert "continuing without it for 3600 s" in caplog.records[-1].getMessage()
    assert "2 of 3 failures in a row" in caplog.records[-2].getMessage()
    health.retry_now()  # the bench expired: probed again
    assert health.available
    health.failed("read", failure, at_once=False)  # the probe failed: benched again at once
    assert not health.available


def test_an_unusable_tier_is_benched_at_once():
    health = TierHealth("test tier", retry_after_s=3600)
    health.failed("write", OSError(errno.ENOSPC, "No space left on device"), at_once=True)
    assert not health.available and "No space left" in health.last_error
    with pytest.raises(ValueError, match="strikes"):
        TierHealth("test tier", 1.0, strikes=0)


@pytest.mark.parametrize("exc,unusable", [
    (OSError(errno.EMFILE, "Too many open files"), False),
    (OSError(errno.ENFILE, "Too many open files in system"), False),
    (OSError(errno.EIO, "Input/output error"), False),
    (PermissionError(errno.EACCES, "Permission denied"), False),
    (OSError(errno.EROFS, "Read-only file system"), True),
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError("no errno: not known to be transient"), True),
    (diskcache.Timeout(), True),
    (sqlite3.OperationalError("database is locked"), False),
    (sqlite3.OperationalError("unable to open database file"), False),
    (sqlite3.OperationalError("attempt to write a readonly database"), True),
    (sqlite3.DatabaseError("file is not a database"), True),
])
def test_the_disk_tier_says_which_failures_make_it_unusable(tmp_path, exc, unusable):
    assert DiskTier(tmp_path / "kv", 1 << 20).unusable(exc) is unusable


def _disk_store(make_store):
    store = make_store(ram_bytes=0, retry_after_s=3600)
    for i in range(4):
        store.put(f"k{i}", make_kv(i))
    return store


@pytest.mark.parametrize("path", ["get", "open_layers"])
def test_io_errors_reading_entry_files_delete_nothing(make_store, tmp_path, monkeypatch, path):
    store = _disk_store(make_store)
    files = entry_digests(tmp_path / "kv")

    def eio(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(readers.os, "preadv", eio)  # layers
    monkeypatch.setattr(readers.os, "pread", eio)  # headers
    for i in range(4):
        if path == "get":
            assert store.get(f"k{i}") is None
        else:
            assert store.open_layers(f"k{i}") is None  # its header cannot be read
    s = store.stats().tier("disk")
    assert (s.available, s.corrupt, s.errors) == (False, 0, 3)  # the 4th was not tried
    monkeypatch.undo()
    assert entry_digests(tmp_path / "kv") == files
    store.tiers[0].health.retry_now()
    assert same_bits(store.get("k3"), make_kv(3))


def test_a_permission_denied_on_an_entry_file_deletes_nothing(make_store, tmp_path,
                                                              monkeypatch):
    store = _disk_store(make_store)
    files = entry_digests(tmp_path / "kv")
    real_open = os.open

    def denied(path, *args, **kwargs):
        if str(path).endswith(".val"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(disk_files.os, "open", denied)
    assert [store.get(f"k{i}") for i in range(2)] == [None, None]
    monkeypatch.undo()
    s = store.stats().tier("disk")
    assert (s.available, s.corrupt, s.errors) == (True, 0, 2)  # two strikes, not benched
    assert same_bits(store.get("k0"), make_kv(0))  # a success clears them
    assert store.tiers[0].health.failures == 0
    assert entry_digests(tmp_path / "kv") == files


class _DamagedOnce(TierWrapper):
    """A tier whose first read of each key fails a check, as bytes damaged on the way would;
    the stored bytes are valid."""

    def __init__(self, tier) -> None:
        super().__init__(tier)
        self.seen: set[str] = set()

    def read(self, key):
        if key not in self.seen:
            self.seen.add(key)
            raise EntryError("checksum mismatch in v.1 (damaged on the way)")
        return self.inner.read(key)


def test_an_entry_a_fresh_read_finds_valid_is_kept(make_store, tmp_path, caplog):
    _disk_store(make_store)
    store = make_store(ram_bytes=0, wrap=_DamagedOnce)
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("k1") is None  # a miss for this request
    s = store.stats().tier("disk")
    assert (s.corrupt, s.errors, s.available) == (1, 0, True)
    assert store.tiers[0].health.failures == 1  # a strike against the tier
    assert any("a fresh read of it is valid" in r.getMessage() for r in caplog.records)
    assert store.contains("k1") and same_bits(store.get("k1"), make_kv(1))


class _RewrittenByANewerBuild(_DamagedOnce):
    """``_DamagedOnce``, whose entry a newer build rewrites before the next read (a rolling
    upgrade over a damaged entry)."""

    def read(self, key):
        if key in self.seen:
            self.inner.put(key, _newer(key, make_kv(7)))
        return super().read(key)


def test_an_entry_a_newer_build_rewrote_before_the_fresh_read_is_kept(make_store, tmp_path):
    _disk_store(make_store)
    store = make_store(ram_bytes=0, wrap=_RewrittenByANewerBuild)
    assert store.get("k1") is None  # a miss here
    assert store.contains("k1")  # valid for the build that wrote it: not deleted
    assert store.tiers[0].tier.inner.fetch("k1") is not None


def test_a_layer_of_an_entry_opened_before_its_tier_was_benched_fails_at_once(make_store):
    """Opened entries do not read through a benched tier: a request holding many of them (a
    frozen server, say) pays no timeout per entry; the layer is a miss the engine recomputes."""
    _disk_store(make_store)
    store = make_store(ram_bytes=0)
    entry = store.open_layers("k2")
    assert entry is not None
    store.tiers[0].health.failed("read", OSError(errno.EROFS, "Read-only file system"))
    with pytest.raises(LayerReadError, match="benched"):
        entry.layer(0)
    entry.close()
    store.tiers[0].health.retry_now()  # probed again: the entry is whole
    assert same_bits(store.open_layers("k2").materialize(), make_kv(2))


def _newer(key: str, kv) -> bytes:
    """``kv`` as a newer build writes it: a format version past every one this build reads."""
    import json

    import safetensors.torch

    from blendrag.store.codec import SIGNED_VERSION, encode, meta_digest

    data = encode(key, kv)
    header = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8: 8 + header])["__metadata__"]
    meta["version"] = str(SIGNED_VERSION + 1)
    del meta["meta_checksum"]
    meta["meta_checksum"] = meta_digest(meta)
    return safetensors.torch.save(safetensors.torch.load(data), metadata=meta)


def test_an_entry_of_a_newer_format_version_is_a_miss_and_is_kept(make_store, tmp_path):
    """Written by a newer build sharing the folder: unreadable here, valid there."""
    newer = _newer("k9", make_kv(9))
    store = make_store(ram_bytes=0)
    store.tiers[0].tier.put("k9", newer)
    files = entry_digests(tmp_path / "kv")
    assert store.get("k9") is None and store.open_layers("k9") is None  # misses
    assert store.contains("k9") and entry_digests(tmp_path / "kv") == files  # kept as it was
    assert store.tiers[0].health.failures == 0  # nothing wrong with the tier either


def test_layers_read_before_the_tier_was_benched_are_still_served(make_store):
    _disk_store(make_store)
    store = make_store(ram_bytes=0)
    entry = store.open_layers("k1")
    k0, v0 = entry.layer(0)
    store.tiers[0].health.failed("read", OSError(errno.EROFS, "Read-only file system"))
    k, v = entry.layer(0)  # held already: no read through the benched tier
    assert torch.equal(k, k0) and torch.equal(v, v0)
    with pytest.raises(LayerReadError, match="benched"):
        entry.layer(1)
    entry.close()
