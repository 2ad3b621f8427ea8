"""The device tier's rules (engine/caches/device_tier.py), on the CPU: an LRU within a byte
budget, keyed by stored names (namespaces never meet), filled only by verified store entries
and computed chunks, never failing a request."""

from __future__ import annotations

import pytest
import torch

from blendrag.engine.caches.device_tier import DeviceTier, default_budget
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.layered import MemoryLayeredEntry

CPU = torch.device("cpu")


def kv(tokens: int, seed: int = 0) -> ChunkKV:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 2, tokens, 4, generator=g)  # [L, Hkv, T, D]
    return ChunkKV(k, torch.randn(2, 2, tokens, 4, generator=g), tuple(range(tokens)))


def nbytes(tokens: int) -> int:
    return 2 * 2 * 2 * tokens * 4 * 4  # K and V, float32


class Partial(MemoryLayeredEntry):
    """A store entry not every layer of which was read (so not verified whole)."""

    complete = False  # type: ignore[assignment]


def test_an_entry_held_is_a_hit_with_its_rows_and_tier():
    tier = DeviceTier(1 << 20, CPU)
    rows = kv(8, seed=1)
    assert tier.put("ns:a", rows) and len(tier) == 1 and tier.bytes == nbytes(8)
    hit = tier.get("ns:a")
    assert hit is not None and hit.tier == "device" and hit.token_ids == rows.token_ids
    for i in range(2):
        k, v = hit.layer(i)
        assert torch.equal(k, rows.keys[i]) and torch.equal(v, rows.values[i])
    assert tier.get("ns:b") is None and tier.hits == 1


def test_least_recently_used_entries_go_first_within_the_budget():
    tier = DeviceTier(3 * nbytes(8), CPU)
    for name in "abc":
        assert tier.put(name, kv(8))
    assert tier.get("a") is not None  # a is now the most recent
    assert tier.put("d", kv(8))  # evicts b, the least recently used
    assert [tier.get(n) is not None for n in "abcd"] == [True, False, True, True]
    assert tier.bytes == 3 * nbytes(8) and tier.evictions == 1
    assert not tier.put("big", kv(32))  # larger than the whole budget: not kept, nothing lost
    assert len(tier) == 3


def test_namespaces_never_meet_their_names_differ():
    tier = DeviceTier(1 << 20, CPU)
    tier.put("tenant-a-id:key", kv(8, seed=1))
    assert tier.get("tenant-b-id:key") is None
    assert tier.get("key") is None


def test_only_verified_store_entries_are_promoted():
    tier = DeviceTier(1 << 20, CPU)
    rows = kv(8)
    assert tier.promote("r", MemoryLayeredEntry(rows, tier="ram"))
    for t in ("disk", "redis", "s3"):
        assert tier.promote(t, MemoryLayeredEntry(rows, tier=t))
    assert not tier.promote("partial", Partial(rows, tier="disk"))  # not read through
    assert not tier.promote("computed", MemoryLayeredEntry(rows, tier="computed"))
    assert not tier.promote("history", MemoryLayeredEntry(rows, tier="history"))
    assert not tier.promote("again", MemoryLayeredEntry(rows, tier="device"))
    assert len(tier) == 4 and tier.promotions == 4
    assert not DeviceTier(0, CPU).promote("off", MemoryLayeredEntry(rows, tier="ram"))


def test_out_of_device_memory_skips_the_copy_and_fails_nothing(monkeypatch):
    import blendrag.engine.caches.device_tier as module

    tier = DeviceTier(1 << 20, CPU)
    tier.put("kept", kv(8))

    def oom(*_):
        raise torch.OutOfMemoryError("no memory")

    monkeypatch.setattr(tier, "_copy", oom)
    assert not tier.put("new", kv(8))
    assert tier.skipped == 1 and len(tier) == 0 and tier.bytes == 0  # evicted to make room
    monkeypatch.undo()
    assert tier.put("new", kv(8)) and module.TIER == "device"


def test_discard_and_clear_drop_entries():
    tier = DeviceTier(1 << 20, CPU)
    tier.put("a", kv(8))
    tier.put("b", kv(8))
    tier.discard("a")
    assert tier.get("a") is None and tier.bytes == nbytes(8)
    tier.clear()
    assert len(tier) == 0 and tier.bytes == 0


def test_bad_budgets_are_refused_and_a_cpu_defaults_to_none():
    for bad in (-1, 1.5, True, "1GB"):
        with pytest.raises(ValueError, match="device tier budget"):
            DeviceTier(bad, CPU)  # type: ignore[arg-type]
    assert default_budget(CPU, 0) == 0


def device_engine(model_dir, tmp_path, budget: int = 64 << 20, **loading):
    from blendrag import BlendEngine
    from blendrag.engine.caches.context import NO_CONTEXT
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.store import StoreConfig, TieredKVStore

    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", kv_format="model"))
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=NO_CONTEXT, store=store,
                                       loading=LoadingConfig(device_tier_bytes=budget,
                                                             **loading))


def test_a_hot_chunk_is_served_from_the_device_tier_with_the_same_logits(model_dir, tmp_path):
    from blendrag import BlendConfig
    from helpers.tiny import PASSAGES, PREFIX, SUFFIX

    # the other namespace below computes its chunks in the request, not in the backfill
    engine = device_engine(model_dir, tmp_path, full_when_missing=None)
    engine.ingest(PASSAGES, prefix=PREFIX)  # bulk ingestion: the chunks stored, not kept
    tier = engine.cache.device_tier
    assert tier is not None and len(tier) == 1  # the prefix, computed once on the device
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    reuse = BlendConfig(mode="reuse")
    cold = engine.prefill(layout, reuse)  # read through from disk, then promoted
    assert len(tier) == len(PASSAGES) + 1 and cold.stats.cache.device_hits == 1  # the prefix
    before = engine.store.stats().tier("disk").bytes_read
    hot = engine.prefill(layout, reuse)
    assert torch.equal(hot.logits, cold.logits)
    assert hot.stats.cache.device_hits == len(PASSAGES) + 1
    assert engine.store.stats().tier("disk").bytes_read == before  # nothing read from disk
    # another namespace never takes these rows: its own store entries, then its own copies
    other = engine.namespaced("acme").prefill(layout, reuse)
    assert other.stats.cache.device_hits == 0 and torch.equal(other.logits, cold.logits)
    assert len(tier) == 2 * (len(PASSAGES) + 1)


def test_a_request_that_computes_its_chunks_keeps_them_on_the_device(model_dir, tmp_path):
    from blendrag import BlendConfig
    from helpers.tiny import PASSAGES, PREFIX, SUFFIX

    # chunks computed in the request, not left to the backfill (test_backfill.py)
    engine = device_engine(model_dir, tmp_path, full_when_missing=None)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    blend = BlendConfig(selector="epic", ratio=0.3)
    first = engine.prefill(layout, blend)  # every chunk a miss: computed, stored, kept
    assert first.stats.cache.chunk_misses == len(PASSAGES)
    second = engine.prefill(layout, blend)
    assert second.stats.cache.device_hits == len(PASSAGES) + 1
    assert torch.equal(first.logits, second.logits)
    engine.store = engine.store  # a store set again: its names may mean other rows
    assert len(engine.cache.device_tier) == 0


def test_a_device_tier_too_small_for_an_entry_fails_nothing(model_dir, tmp_path):
    from blendrag import BlendConfig
    from helpers.tiny import PASSAGES, PREFIX, SUFFIX

    engine = device_engine(model_dir, tmp_path, budget=64)  # smaller than any entry
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    a = engine.prefill(layout, BlendConfig(mode="reuse"))
    b = engine.prefill(layout, BlendConfig(mode="reuse"))
    assert torch.equal(a.logits, b.logits) and b.stats.cache.device_hits == 0
    assert len(engine.cache.device_tier) == 0


def test_an_empty_device_tier_is_filled_from_the_ram_tier(model_dir):
    """Entries a request reads from the RAM tier are promoted even while the device tier holds
    nothing yet (an empty tier once read as 'no tier': nothing was ever promoted)."""
    from blendrag import BlendConfig, BlendEngine
    from blendrag.engine.caches.context import NO_CONTEXT
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.store import StoreConfig, TieredKVStore
    from helpers.tiny import PASSAGES, PREFIX, SUFFIX

    engine = BlendEngine.from_pretrained(
        model_dir("llama"), device="cpu", chat=False, context=NO_CONTEXT,
        store=TieredKVStore(StoreConfig(ram_bytes=64 << 20)),
        loading=LoadingConfig(device_tier_bytes=0))
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.precompute(layout.prefix_ids, layout.chunk_ids)  # in the RAM tier only
    engine.cache.device_tier = DeviceTier(64 << 20, engine.runner.device)  # empty, now on
    assert len(engine.cache.device_tier) == 0
    reuse = BlendConfig(mode="reuse")
    cold = engine.prefill(layout, reuse)
    assert cold.stats.cache.device_hits == 0
    assert len(engine.cache.device_tier) == len(PASSAGES) + 1  # promoted after the request
    hot = engine.prefill(layout, reuse)
    assert hot.stats.cache.device_hits == len(PASSAGES) + 1
    assert torch.equal(hot.logits, cold.logits)


def test_a_profile_measured_in_a_request_replaces_the_copies_without_one(model_dir, tmp_path):
    """Chunks stored without a profile, met by the ``profile`` selector: the first request
    measures and stores their profiles once; the rows it opened without one go neither over
    the RAM tier's profiled copy nor to the device tier, so later requests hit the profiled
    rows there and measure nothing again."""
    from blendrag import BlendConfig, BlendEngine
    from blendrag.engine.caches.context import NO_CONTEXT
    from blendrag.engine.selection.controller import LoadingConfig
    from blendrag.store import StoreConfig, TieredKVStore
    from helpers.tiny import PASSAGES, PREFIX, SUFFIX

    for budget in (0, 64 << 20):
        store = TieredKVStore(StoreConfig(ram_bytes=64 << 20, disk_dir=tmp_path / f"kv{budget}",
                                          kv_format="model"))
        engine = BlendEngine.from_pretrained(
            model_dir("llama"), device="cpu", chat=False, context=NO_CONTEXT, store=store,
            loading=LoadingConfig(full_when_missing=None, device_tier_bytes=budget))
        layout = engine.build_prompt(PREFIX, PASSAGES[:3], SUFFIX)
        engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)  # without profiles
        store.tiers[0].tier.clear()  # read through from disk, as after a restart
        config = BlendConfig(selector="profile", ratio=0.3)
        runs = [engine.prefill(config=config, layout=layout) for _ in range(3)]
        assert [r.stats.cache.profiles_computed for r in runs] == [3, 0, 0], budget
        if budget:
            assert [r.stats.cache.device_hits for r in runs[1:]] == [4, 4]
        assert all(torch.equal(r.logits, runs[0].logits) for r in runs)
        for ids in layout.chunk_ids:
            held = store.tiers[0].tier.open_layers(
                store.stored_name(engine.key(layout.chunk_prefix_ids, ids)))
            assert held is not None and held.profile is not None  # the RAM tier's copy
