"""The store against a hostile or damaged store folder and Redis server: no file
outside the store is read or deleted, a crafted entry or a FIFO is a logged miss that is
dropped, a planted settings row benches the tier, Redis namespaces are disjoint, and configs
with NaN timeouts are refused."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path

import pytest

from blendrag.store import DiskTier, EntryError, StoreConfig, TieredKVStore, decode, encode
from blendrag.store.codec import meta_digest
from helpers.kvgen import make_kv, rewrite_header, same_bits


def _disk_only(make_store):
    return make_store(ram_bytes=0)


def _entry_file(store, key: str) -> Path:
    return DiskTier(store.config.disk_dir, None).entry_path(key)


def _set_filename(store, key: str, filename: str) -> None:
    """Tamper with the index row of ``key`` as someone with write access to the folder could."""
    with sqlite3.connect(store.config.disk_dir / "cache.db") as db:
        assert db.execute("UPDATE Cache SET filename = ? WHERE key = ?", (filename, key)).rowcount


@pytest.mark.parametrize("relative", [False, True])
def test_index_row_naming_a_file_outside_the_store_neither_reads_nor_deletes_it(
        make_store, tmp_path, relative, caplog):
    store = _disk_only(make_store)
    store.put("k", make_kv(1))
    outside = tmp_path / "victim" / "deep" / "keep.safetensors"
    outside.parent.mkdir(parents=True)
    planted = encode("k", make_kv(2))  # a valid entry for this key, even
    outside.write_bytes(planted)
    name = os.path.relpath(outside, store.config.disk_dir) if relative else str(outside)
    _set_filename(store, "k", name)
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("k") is None
    assert outside.read_bytes() == planted  # neither deleted nor its folders
    assert not store.contains("k")  # the row is dropped
    assert store.stats().tier("disk").corrupt == 1
    assert any("outside the store" in r.getMessage() for r in caplog.records)
    store.put("k", make_kv(1))
    assert same_bits(store.get("k"), make_kv(1))


def _with_shape(data: bytes, shape: list[int]) -> bytes:
    """``data`` with the metadata's declared shape replaced and its checksum recomputed."""
    def edit(header: dict) -> None:
        meta = header["__metadata__"]
        meta["shape"] = json.dumps(shape)
        meta["meta_checksum"] = meta_digest({k: v for k, v in meta.items()
                                              if k != "meta_checksum"})
    return rewrite_header(data, edit)


# make_kv(1): 3 layers, 2 heads, 8 tokens, head_dim 16
BAD_SHAPES = [[3, -2, 8, 16], [3, 2, 8, -16], [3, 10**9, 8, 16], [10**12, 2, 8, 16],
              [3, 2, 8, 10**15], [3, 0, 8, 16]]


@pytest.mark.parametrize("shape", BAD_SHAPES)
def test_crafted_header_shape_is_an_entry_error_before_any_allocation(shape):
    data = _with_shape(encode("k", make_kv(1)), shape)
    with pytest.raises(EntryError):
        decode(data, "k")


@pytest.mark.parametrize("shape", BAD_SHAPES[:4])
def test_crafted_header_shape_on_disk_is_a_dropped_miss(make_store, shape):
    store = _disk_only(make_store)
    store.put("k", make_kv(1))
    path = _entry_file(store, "k")
    path.write_bytes(_with_shape(path.read_bytes(), shape))
    assert store.get("k") is None and store.get("k") is None  # a miss, not a crash, twice
    assert not store.contains("k") and store.stats().tier("disk").corrupt == 1


@pytest.mark.timeout(60)
def test_fifo_in_place_of_an_entry_file_is_a_miss_not_a_hang(make_store, tmp_path):
    store = _disk_only(make_store)
    store.put("k", make_kv(1))
    path = _entry_file(store, "k")
    path.unlink()
    os.mkfifo(path)
    assert store.get("k") is None
    assert not store.contains("k") and not path.exists()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(EntryError, match="regular file"):  # the codec's own path reader too
        decode(tmp_path / "fifo", "k")


def test_symlink_in_place_of_an_entry_file_is_not_followed(make_store, tmp_path):
    store = _disk_only(make_store)
    store.put("k", make_kv(1))
    path = _entry_file(store, "k")
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)
    assert store.get("k") is None and target.exists() and not store.contains("k")


@pytest.mark.parametrize("row", [("disk_evil", 1), ("disk_directory", "/etc")])
def test_planted_settings_row_benches_the_disk_tier_with_a_warning(tmp_path, row, caplog):
    config = StoreConfig(ram_bytes=1 << 20, disk_dir=tmp_path / "kv", disk_bytes=4 << 20)
    TieredKVStore(config).close()
    with sqlite3.connect(tmp_path / "kv" / "cache.db") as db:
        db.execute("INSERT OR REPLACE INTO Settings VALUES (?, ?)", row)
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        store = TieredKVStore(config)  # no TypeError
    assert any("damaged settings" in r.getMessage() for r in caplog.records)
    assert store.stats().tier("disk").available is False
    store.put("k", make_kv(1))  # RAM still serves
    assert same_bits(store.get("k"), make_kv(1))
    store.close()


def test_planted_budget_is_refused_where_the_stored_budget_is_used(tmp_path):
    tier = DiskTier(tmp_path / "kv", 4 << 20)
    tier.open()
    tier.close()
    with sqlite3.connect(tmp_path / "kv" / "cache.db") as db:
        db.execute("UPDATE Settings SET value = 'lots' WHERE key = 'size_limit'")
    with pytest.raises(OSError, match="damaged settings.*size_limit"):
        DiskTier(tmp_path / "kv", None).open()  # as `blendrag cache stats` opens it


def test_redis_clear_leaves_other_namespaces_alone(make_store, redis_server):
    stores = {p: make_store(disk_dir=None, redis_url=redis_server.url, redis_prefix=p)
              for p in ("app1", "app10", "app1:x")}
    for i, store in enumerate(stores.values()):
        store.put("k", make_kv(i))
    assert redis_server.client().exists("app1:k", "app10:k", "app1:x:k") == 3
    stores["app1"].clear()
    client = redis_server.client()
    assert client.exists("app1:k") == 0 and client.exists("app10:k", "app1:x:k") == 2
    assert same_bits(stores["app10"].get("k"), make_kv(1))
    from blendrag.store import RedisTier

    assert RedisTier(redis_server.url, "app1:x:").count_entries() == 1
    assert RedisTier(redis_server.url, "app1").count_entries() == 0


@pytest.mark.parametrize("field", ["retry_after_s", "disk_timeout_s", "redis_timeout_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, "10"])
def test_store_config_refuses_non_finite_times(field, value):
    with pytest.raises(ValueError, match=field):
        StoreConfig(**{field: value})


@pytest.mark.parametrize("prefix", ["", ":", "::"])
def test_store_config_refuses_an_empty_redis_namespace(prefix):
    with pytest.raises(ValueError, match="redis_prefix"):
        StoreConfig(redis_prefix=prefix)
