"""TieredKVStore over RAM + disk: read-through, promotion, write-through, stats, clear."""

from __future__ import annotations

import pytest
import torch

from blendrag.kv.locked import REGISTRY, is_locked
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.protocol import KVStore
from helpers.kvgen import make_kv, same_bits


def test_is_a_kvstore_and_round_trips(make_store):
    store = make_store()
    assert isinstance(store, KVStore)
    kv = make_kv(1, dtype=torch.bfloat16)
    store.put("k1", kv)
    assert store.contains("k1") and not store.contains("k2")
    assert same_bits(store.get("k1"), kv)
    assert store.get("k2") is None


def test_disk_hit_is_promoted_to_ram(make_store):
    writer = make_store()
    kv = make_kv(2)
    writer.put("k", kv)
    reader = make_store()  # fresh RAM tier on the same directory
    first = reader.get("k")
    assert same_bits(first, kv)
    s = reader.stats()
    assert (s.tier("ram").misses, s.tier("disk").hits, s.tier("ram").entries) == (1, 1, 1)
    assert s.tier("disk").bytes_read > kv.nbytes  # payload plus header
    assert reader.get("k") is first  # second read served by RAM
    s = reader.stats()
    assert (s.tier("ram").hits, s.tier("disk").hits, s.gets, s.hits, s.misses) == (1, 1, 2, 2, 0)


def test_put_writes_through_every_tier(make_store, tmp_path):
    store = make_store()
    store.put("k", make_kv(3))
    s = store.stats()
    assert s.tier("ram").entries == 1 and s.tier("disk").entries == 1
    assert s.tier("disk").bytes_written > 0 and s.tier("ram").bytes_written == make_kv(3).nbytes


def test_ram_tier_respects_its_byte_budget_and_lru_order(make_store):
    one = make_kv(0).nbytes
    store = make_store(ram_bytes=3 * one, disk_dir=None)
    for i in range(3):
        store.put(f"k{i}", make_kv(i))
    assert store.get("k0") is not None  # k0 now most recent: k1 is the LRU entry
    store.put("k3", make_kv(3))
    s = store.stats().tier("ram")
    assert s.used_bytes <= s.budget_bytes == 3 * one
    assert [store.contains(f"k{i}") for i in range(4)] == [True, False, True, True]
    for i in range(4, 20):
        store.put(f"k{i}", make_kv(i))
        assert store.stats().tier("ram").used_bytes <= 3 * one


def test_ram_tier_skips_an_entry_larger_than_its_budget(make_store):
    store = make_store(ram_bytes=100)
    store.put("big", make_kv(1))
    s = store.stats()
    assert s.tier("ram").entries == 0 and s.tier("disk").entries == 1
    assert same_bits(store.get("big"), make_kv(1))


def test_precompute_api_missing_and_bulk_puts_bypass_ram(make_store):
    store = make_store()
    store.put("k0", make_kv(0))
    assert store.missing(["k0", "k1", "k2"]) == ["k1", "k2"]
    for i in (1, 2):
        store.put(f"k{i}", make_kv(i), ram=False)
    assert store.missing(["k0", "k1", "k2"]) == []
    s = store.stats()
    assert s.tier("ram").entries == 1 and s.tier("disk").entries == 3


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_tensors_are_stored_as_cpu_copies(make_store):
    store = make_store()
    kv = make_kv(4, dtype=torch.bfloat16)
    store.put("k", kv.to("cuda"))
    held = store.get("k")
    assert held.keys.device.type == "cpu"  # the RAM tier is host memory, page-locked
    assert held.keys.is_pinned() and is_locked(held.keys) and is_locked(held.values)
    assert same_bits(held, kv)
    live = set(REGISTRY.starts)
    store.put("bulk", kv.to("cuda"), ram=False)  # for the disk only: nothing locked for it
    assert set(REGISTRY.starts) <= live and same_bits(make_store().get("bulk"), kv)
    assert same_bits(make_store().get("k"), kv)  # and the disk copy is exact


def test_only_rows_for_the_ram_tier_are_asked_to_be_locked(make_store, monkeypatch):
    import blendrag.store.tiered as tiered

    asked = []
    real = tiered._on_cpu
    monkeypatch.setattr(tiered, "_on_cpu", lambda kv, locked: asked.append(locked) or real(
        kv, locked))
    store = make_store()
    store.put("a", make_kv(1))
    store.put("b", make_kv(2), ram=False)
    assert asked == [True, False]
    ram_only = TieredKVStore(StoreConfig(ram_bytes=1 << 20, disk_dir=None))
    ram_only.put("c", make_kv(3), ram=False)  # RAM is the only tier: it holds the rows
    assert asked == [True, False, True]


def test_clear_empties_every_tier_and_reset_stats_zeroes_counters(make_store):
    store = make_store()
    for i in range(3):
        store.put(f"k{i}", make_kv(i))
    store.get("k0")
    store.clear()
    s = store.stats()
    assert s.tier("ram").entries == 0 and s.tier("disk").entries == 0
    assert store.get("k1") is None and store.missing(["k0", "k1"]) == ["k0", "k1"]
    store.reset_stats()
    s = store.stats()
    assert (s.gets, s.tier("ram").hits, s.tier("disk").misses, s.tier("disk").bytes_written) == (
        0,
        0,
        0,
        0,
    )


def test_delete_removes_from_every_tier(make_store):
    store = make_store()
    store.put("k", make_kv(1))
    store.delete("k")
    assert not store.contains("k") and store.get("k") is None


def test_stats_snapshot_is_frozen_and_serializable(make_store):
    import json

    store = make_store()
    store.put("k", make_kv(1))
    store.get("k")
    snap = store.stats()
    with pytest.raises(AttributeError):
        snap.gets = 5  # type: ignore[misc]
    d = json.loads(json.dumps(snap.to_dict()))
    assert d["gets"] == 1 and d["tiers"][0]["name"] == "ram" and d["hit_rate"] == 1.0
    assert "disk" in snap.format()


def test_ram_only_store_has_no_disk_tier():
    store = TieredKVStore(StoreConfig(ram_bytes=1 << 20, disk_dir=None))
    store.put("k", make_kv(1))
    assert [t.name for t in store.stats().tiers] == ["ram"]
    with pytest.raises(KeyError):
        store.stats().tier("disk")


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"ram_bytes": -1}, "ram_bytes"),
        ({"disk_bytes": 0}, "disk_bytes"),
        ({"redis_url": "http://x"}, "redis_url"),
        ({"redis_prefix": ""}, "redis_prefix"),
        ({"redis_ttl_s": 0}, "redis_ttl_s"),
        ({"retry_after_s": -1.0}, "retry_after_s"),
        ({"ram_bytes": 0, "disk_dir": None}, "no tier"),
    ],
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        StoreConfig(**kw)


def test_config_defaults_are_ram_plus_disk():
    cfg = StoreConfig()
    assert cfg.ram_bytes > 0 and cfg.disk_dir is not None and cfg.redis_url is None
    assert cfg.disk_dir.parts[-2:] == ("blendrag", "kv")
