"""Request stats report what this request did to the store (a delta), not the store's totals."""

from __future__ import annotations

import pytest

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine
from blendrag.ingest import ingest_source
from blendrag.store import StoreConfig, TieredKVStore
from helpers.kvgen import make_kv
from helpers.tiny import COMPUTED_FIRST, PASSAGES, PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiers(stats) -> dict[str, tuple[int, int]]:
    """{tier: (hits, misses)} of a request's store delta."""
    return {t["name"]: (t["hits"], t["misses"]) for t in stats.cache.store["tiers"]}


def test_per_request_deltas_show_disk_hits_after_ram_is_cleared(model_dir, tmp_path):
    config = StoreConfig(ram_bytes=1 << 20, disk_dir=tmp_path / "kv", disk_bytes=4 << 20)
    # the cold request computes and writes its chunks itself: its own writes are counted
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=TieredKVStore(config), context=NO_CONTEXT,
                                         loading=COMPUTED_FIRST)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    n = len(PASSAGES)
    cold = engine.prefill(layout, BlendConfig(ratio=0.3)).stats.cache.store
    assert (cold["gets"], cold["misses"]) == (1 + n, 1 + n)
    assert cold["tiers"][1]["bytes_written"] > 0 and cold["tiers"][1]["bytes_read"] == 0
    warm = engine.prefill(layout, BlendConfig(ratio=0.3)).stats
    assert _tiers(warm) == {"ram": (1 + n, 0), "disk": (0, 0)}  # this request only, not the totals
    assert warm.cache.store["gets"] == warm.cache.store["hits"] == 1 + n
    assert warm.cache.store["tiers"][0]["bytes_written"] == 0

    engine.store.close()
    engine.store = TieredKVStore(config)  # RAM cleared (a new process), the disk tier kept
    reloaded = engine.prefill(layout, BlendConfig(ratio=0.3)).stats
    assert _tiers(reloaded) == {"ram": (0, 1 + n), "disk": (1 + n, 0)}
    disk = reloaded.cache.store["tiers"][1]
    assert disk["bytes_read"] > 0 and disk["load_seconds"] > 0 and disk["entries"] == 1 + n
    assert _tiers(engine.prefill(layout, BlendConfig(ratio=0.3)).stats) == {
        "ram": (1 + n, 0),
        "disk": (0, 0),
    }


def test_precomputed_chunks_are_served_from_disk_first(model_dir, make_store):
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=make_store(), context=NO_CONTEXT)
    ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    stats = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
                           BlendConfig(ratio=0.3)).stats
    cache = stats.cache
    assert (cache.chunk_hits, cache.chunk_misses, cache.prefix_hit) == (len(PASSAGES), 0, True)
    assert _tiers(stats) == {"ram": (1, len(PASSAGES)), "disk": (len(PASSAGES), 0)}


def test_since_subtracts_counters_and_keeps_usage(make_store):
    store = make_store()
    store.put("a", make_kv(1))
    before = store.stats()
    store.get("a")
    store.get("b")
    delta = store.stats().since(before)
    assert (delta.gets, delta.hits, delta.misses, delta.hit_rate) == (2, 1, 1, 0.5)
    ram, disk = delta.tier("ram"), delta.tier("disk")
    assert (ram.hits, ram.misses, ram.bytes_written, ram.entries) == (1, 1, 0, 1)
    assert (disk.hits, disk.misses, disk.bytes_written, disk.entries) == (0, 1, 0, 1)


def test_a_layer_read_twice_or_materialized_is_counted_once(tmp_path):
    """A request's own bytes read count each layer of an opened entry once, whether it came
    through ``layer`` (the feed), ``materialize`` (an entry not read yet: layer by layer; one
    read already: in one step), or both, and equal the disk tier's own count."""
    from blendrag.engine.request.request_store import RequestStore

    kv = make_kv(2, layers=4)
    config = StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", disk_bytes=4 << 20)
    TieredKVStore(config).put("k", kv)
    for reads in ([], [0, 2], [0, 1, 2, 3]):
        store = TieredKVStore(config)
        request = RequestStore(store)
        entry = request.open_layers("k")
        for i in reads:
            entry.layer(i)
        entry.materialize()
        entry.layer(1)
        entry.materialize()
        entry.close()
        own = request.stats().tier("disk").bytes_read
        assert own == 4 * entry.stored_layer_nbytes, reads
        assert store.stats().tier("disk").bytes_read == own, reads
        store.close()
