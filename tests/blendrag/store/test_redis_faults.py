"""The Redis tier behind a proxy that truncates or cuts replies (``helpers.resp_proxy``): bytes
lost on the way are a miss and a strike against the tier, never a deleted entry, and a tier
that keeps failing is benched, then probed again."""

from __future__ import annotations

import os
import signal
import time

import pytest

from blendrag.store.layered import LayerReadError
from helpers.kvgen import make_kv, same_bits
from helpers.resp_proxy import TruncatingProxy
from helpers.servers import redis_or_skip

KEYS = [f"k{i}" for i in range(6)]
BIG = dict(layers=4, heads=2, tokens=256, dim=64)  # 256 KiB a layer: past the 64 KiB head


@pytest.fixture
def proxy(redis_server):
    p = TruncatingProxy(redis_server.port)
    yield p
    p.close()


def _fill(make_store, redis_server, prefix: str, **kv) -> dict[str, bytes]:
    """KEYS stored on the real server (seed = index); their stored bytes."""
    writer = make_store(ram_bytes=0, disk_dir=None, redis_url=redis_server.url,
                        redis_prefix=prefix)
    for i, key in enumerate(KEYS):
        writer.put(key, make_kv(i, **kv))
    client = redis_server.client()
    stored = {key: client.get(prefix + key) for key in KEYS}
    client.close()
    return stored


def _through(make_store, proxy, prefix: str):
    return make_store(ram_bytes=0, disk_dir=None, redis_url=proxy.url, redis_prefix=prefix,
                      redis_timeout_s=2.0, retry_after_s=3600)


def _read(store, key: str, path: str):
    """The entry by ``get`` or by ``open_layers`` (every layer read); None for a miss or a
    layer that failed."""
    if path == "get":
        return store.get(key)
    entry = store.open_layers(key)
    if entry is None:
        return None
    try:
        return entry.materialize()
    except LayerReadError:
        return None
    finally:
        entry.close()


def _unchanged(redis_server, prefix: str, stored: dict[str, bytes]) -> bool:
    client = redis_server.client()
    try:
        return all(client.get(prefix + key) == data for key, data in stored.items())
    finally:
        client.close()


@pytest.mark.parametrize("path", ["get", "open_layers"])
@pytest.mark.parametrize("mode", ["half", "one_short", "cut"])
def test_truncated_or_cut_replies_delete_nothing_and_bench_the_tier(
        make_store, redis_server, redis_prefix, proxy, mode, path):
    stored = _fill(make_store, redis_server, redis_prefix)
    store = _through(make_store, proxy, redis_prefix)
    proxy.mode = mode
    t0 = time.perf_counter()
    got = [_read(store, key, path) for key in KEYS]
    took = time.perf_counter() - t0
    assert got == [None] * len(KEYS)  # never wrong bytes: a miss
    assert _unchanged(redis_server, redis_prefix, stored)  # no valid entry deleted
    s = store.stats()
    assert (s.tier("redis").available, s.tier("redis").corrupt, s.misses) == (False, 0,
                                                                              len(KEYS))
    # benched at once for a cut connection, after three short replies in a row otherwise
    assert s.tier("redis").errors == (1 if mode == "cut" else 3)
    damaged = proxy.damaged
    assert damaged >= 1 and took < 15
    assert [_read(store, key, path) for key in KEYS] == [None] * len(KEYS)
    assert proxy.damaged == damaged  # benched: later requests no longer ask the server

    # the fault is gone and the bench has expired: the tier is probed and serves again
    proxy.mode = "pass"
    store.tiers[0].health.retry_now()
    for i, key in enumerate(KEYS):
        assert same_bits(_read(store, key, path), make_kv(i))
    assert store.stats().tier("redis").available


@pytest.mark.parametrize("mode", ["half", "one_short"])
def test_truncated_layer_replies_fail_the_layer_not_the_entry(
        make_store, redis_server, redis_prefix, proxy, mode):
    stored = _fill(make_store, redis_server, redis_prefix, **BIG)
    proxy.min_bulk = 100_000  # the 64 KiB head passes; each layer's range is cut short
    store = _through(make_store, proxy, redis_prefix)
    proxy.mode = mode
    entry = store.open_layers(KEYS[0])
    with pytest.raises(LayerReadError):
        entry.layer(0)
    entry.close()
    s = store.stats().tier("redis")
    assert (s.available, s.corrupt, s.errors) == (True, 0, 1)  # one strike, not a defect
    for key in KEYS[1:3]:
        entry = store.open_layers(key)
        with pytest.raises(LayerReadError):
            entry.layer(0)
        entry.close()
    assert not store.stats().tier("redis").available  # the third strike in a row benches it
    assert store.open_layers(KEYS[3]) is None
    assert _unchanged(redis_server, redis_prefix, stored)


def test_a_success_between_failures_clears_the_strikes(make_store, redis_server, redis_prefix,
                                                       proxy):
    _fill(make_store, redis_server, redis_prefix)
    store = _through(make_store, proxy, redis_prefix)
    for _ in range(3):
        proxy.mode = "half"
        assert [store.get(key) for key in KEYS[:2]] == [None, None]  # two strikes
        proxy.mode = "pass"
        assert same_bits(store.get(KEYS[2]), make_kv(2))  # a success: strikes cleared
    s = store.stats().tier("redis")
    assert (s.available, s.errors, s.hits) == (True, 6, 3)


def test_an_entry_damaged_on_the_server_is_still_deleted(make_store, redis_server, redis_prefix,
                                                         proxy):
    """The rule's other side: a fresh read of the stored bytes fails its checks too."""
    _fill(make_store, redis_server, redis_prefix)
    client = redis_server.client()
    data = client.get(redis_prefix + KEYS[0])
    client.set(redis_prefix + KEYS[0], data[:-5] + bytes(b ^ 0xFF for b in data[-5:]))
    store = _through(make_store, proxy, redis_prefix)
    assert store.get(KEYS[0]) is None
    assert client.exists(redis_prefix + KEYS[0]) == 0
    s = store.stats().tier("redis")
    assert (s.available, s.corrupt, s.errors) == (True, 1, 0)
    client.close()


@pytest.fixture
def own_redis(tmp_path):
    """A server of this test's own, to freeze or to squeeze (the test skipped, saying why,
    where none can start)."""
    pytest.importorskip("redis", reason="redis-py not installed (pip install 'blendrag[redis]')")
    server = redis_or_skip(tmp_path / "redis")
    yield server
    os.kill(server._proc.pid, signal.SIGCONT)
    server.stop()


def test_a_frozen_server_benches_the_tier_at_once_and_loses_nothing(make_store, own_redis,
                                                                   redis_prefix):
    stored = _fill(make_store, own_redis, redis_prefix)
    store = make_store(ram_bytes=0, disk_dir=None, redis_url=own_redis.url,
                       redis_prefix=redis_prefix, redis_timeout_s=0.5, retry_after_s=3600)
    os.kill(own_redis._proc.pid, signal.SIGSTOP)
    t0 = time.perf_counter()
    assert [store.get(key) for key in KEYS] == [None] * len(KEYS)
    took = time.perf_counter() - t0
    os.kill(own_redis._proc.pid, signal.SIGCONT)
    s = store.stats().tier("redis")
    assert (s.available, s.errors, s.corrupt) == (False, 1, 0)  # one timeout benched it
    assert took < 10  # the client's retries, once; the other keys do not wait
    assert _unchanged(own_redis, redis_prefix, stored)
    store.tiers[0].health.retry_now()
    assert same_bits(store.get(KEYS[0]), make_kv(0))


def test_an_evicting_server_gives_misses_never_wrong_rows(make_store, own_redis, redis_prefix):
    client = own_redis.client()
    # room for a few 1 MiB entries (and a 1 MiB query buffer) above what the empty server uses
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + (5 << 20))
    client.config_set("maxmemory-policy", "allkeys-lru")
    _fill(make_store, own_redis, redis_prefix, **BIG)  # 1 MiB each: most are evicted already
    store = make_store(ram_bytes=0, disk_dir=None, redis_url=own_redis.url,
                       redis_prefix=redis_prefix)
    for i, key in enumerate(KEYS):
        kv = store.get(key)
        assert kv is None or same_bits(kv, make_kv(i, **BIG))
    opened = {i: store.open_layers(key) for i, key in enumerate(KEYS)}
    opened = {i: e for i, e in opened.items() if e is not None}
    assert opened  # the most recent entries were still there
    for j in range(8):  # evict what was opened, between its header and its layers
        client.set(f"{redis_prefix}flood{j}", os.urandom(1 << 20))
    assert not any(client.exists(redis_prefix + KEYS[i]) for i in opened)
    for entry in opened.values():
        with pytest.raises(LayerReadError):
            entry.layer(0)
        entry.close()
    s = store.stats().tier("redis")
    assert s.available and s.errors == 0  # the server is fine; the entries are gone
    assert store.tiers[0].health.failures == 0
    client.close()
