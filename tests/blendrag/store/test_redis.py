"""Redis tier against a real redis-server on a free loopback port (started by the fixture)."""

from __future__ import annotations

import logging

import pytest

from blendrag.store import encode
from blendrag_servers.redis_server import free_port
from helpers.kvgen import make_kv, same_bits
from helpers.servers import redis_or_skip


@pytest.fixture
def redis_store(make_store, redis_server, redis_prefix):
    """factory(**overrides) -> store with the Redis tier (disk off unless asked for)."""

    def make(**kw):
        kw.setdefault("disk_dir", None)
        kw.setdefault("redis_url", redis_server.url)
        return make_store(redis_prefix=redis_prefix, **kw)

    return make


def test_entries_are_shared_through_redis(redis_store, redis_server, redis_prefix):
    writer = redis_store()
    kv = make_kv(1)
    writer.put("k", kv)
    assert redis_server.client().exists(redis_prefix + "k") == 1
    reader = redis_store()  # another process would see the same: nothing local is shared
    assert reader.contains("k") and not reader.contains("other")
    assert same_bits(reader.get("k"), kv)
    s = reader.stats()
    assert (s.tier("ram").misses, s.tier("redis").hits, s.tier("redis").bytes_read) == (
        1,
        1,
        len(encode("k", kv)),
    )


def test_redis_hit_is_promoted_to_disk_and_ram(redis_store, tmp_path):
    redis_store().put("k", make_kv(2))
    store = redis_store(disk_dir=tmp_path / "disk")
    assert not store.stats().tier("disk").entries
    assert same_bits(store.get("k"), make_kv(2))
    s = store.stats()
    assert (s.tier("ram").entries, s.tier("disk").entries, s.tier("redis").hits) == (1, 1, 1)
    store.get("k")
    assert store.stats().tier("redis").hits == 1  # now served by RAM
    disk_only = redis_store(disk_dir=tmp_path / "disk", redis_url=None, ram_bytes=0)
    assert same_bits(disk_only.get("k"), make_kv(2))


def test_corrupt_redis_entry_is_a_logged_miss_and_is_deleted(redis_store, redis_server,
                                                             redis_prefix, caplog):
    store = redis_store(ram_bytes=0)
    store.put("k", make_kv(3))
    client = redis_server.client()
    data = client.get(redis_prefix + "k")
    client.set(redis_prefix + "k", data[: len(data) - 7])
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        assert store.get("k") is None
    assert any("unusable" in r.getMessage() for r in caplog.records)
    assert client.exists(redis_prefix + "k") == 0 and store.stats().tier("redis").corrupt == 1


def test_clear_deletes_only_this_prefix(redis_store, redis_server, redis_prefix):
    client = redis_server.client()
    client.set("unrelated:key", b"keep me")
    store = redis_store()
    for i in range(3):
        store.put(f"k{i}", make_kv(i))
    store.clear()
    assert list(client.scan_iter(match=redis_prefix + "*")) == []
    assert client.get("unrelated:key") == b"keep me"


def test_ttl_is_applied(redis_store, redis_server, redis_prefix):
    redis_store(redis_ttl_s=600).put("k", make_kv(1))
    assert 0 < redis_server.client().ttl(redis_prefix + "k") <= 600


def test_redis_going_down_degrades_with_a_warning(make_store, tmp_path, caplog):
    pytest.importorskip("redis", reason="redis-py not installed (pip install 'blendrag[redis]')")
    server = redis_or_skip(tmp_path)
    try:
        store = make_store(disk_dir=None, redis_url=server.url, redis_timeout_s=1.0)
        store.put("k0", make_kv(0))
    finally:
        server.stop()
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        store.put("k1", make_kv(1))  # RAM still takes it
        assert same_bits(store.get("k1"), make_kv(1)) and store.get("nope") is None
        assert store.contains("k0")  # RAM copy
    warnings = [r.getMessage() for r in caplog.records if "redis tier" in r.getMessage()]
    assert len(warnings) == 1 and "continuing without it" in warnings[0]
    assert store.stats().tier("redis").available is False


def test_unreachable_redis_at_start_is_a_warning_not_an_error(make_store, caplog):
    pytest.importorskip("redis")
    with caplog.at_level(logging.WARNING, logger="blendrag.store"):
        store = make_store(disk_dir=None, redis_url=f"redis://127.0.0.1:{free_port()}/0",
                           redis_timeout_s=0.5)
    assert any("failed to open" in r.getMessage() for r in caplog.records)
    store.put("k", make_kv(1))
    assert same_bits(store.get("k"), make_kv(1))
