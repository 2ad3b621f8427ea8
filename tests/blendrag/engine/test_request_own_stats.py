"""A request's store stats are its own: another tenant's requests, served at the same time on
the same tiers, never show in them (they counted 4-7 disk hits against the request's own 2)."""

from __future__ import annotations

import threading

import pytest

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.ram import MemoryKVStore
from helpers.tiny import COMPUTED_FIRST, PASSAGES, PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")

BLEND = BlendConfig(ratio=0.3)
ROUNDS = 6


def _tiers(stats) -> dict[str, tuple[int, int]]:
    """{tier: (hits, misses)} of a request's store share."""
    return {t["name"]: (t["hits"], t["misses"]) for t in stats.cache.store["tiers"]}


def test_two_tenants_at_once_each_see_only_their_own_hits(model_dir, tmp_path):
    config = StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", kv_format="model")
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=TieredKVStore(config), context=NO_CONTEXT,
                                         threads=None)
    tenants = {"a": engine.namespaced("tenant-a"), "b": engine.namespaced("tenant-b")}
    # tenant b reads twice as many chunks as tenant a: a mix-up shows in either
    layouts = {"a": engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
               "b": engine.build_prompt(PREFIX, PASSAGES, SUFFIX)}
    for name, tenant in tenants.items():
        tenant.ingest(PASSAGES[:len(layouts[name].chunk_ids)], prefix=PREFIX)  # on disk
    seen: dict[str, list] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def serve(name: str) -> None:
        start.wait()
        for _ in range(ROUNDS):
            seen[name].append(tenants[name].prefill(layouts[name], BLEND).stats)

    threads = [threading.Thread(target=serve, args=(n,)) for n in tenants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, layout in layouts.items():
        own = 1 + len(layout.chunk_ids)  # the prefix and each chunk, all on disk
        for stats in seen[name]:
            assert _tiers(stats) == {"disk": (own, 0)}
            store = stats.cache.store
            assert (store["gets"], store["hits"], store["misses"]) == (own, own, 0)
            disk = store["tiers"][0]
            assert disk["bytes_read"] > 0 and disk["bytes_written"] == 0
    # the store's own counters hold everyone's: every request of both tenants
    total = engine.store.stats().tier("disk").hits
    assert total == ROUNDS * (2 + 1 + len(PASSAGES))
    engine.store.close()


def test_a_cold_request_counts_its_own_writes_and_misses(model_dir):
    # the cold request computes and writes its chunks itself (not the backfill's worker)
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=MemoryKVStore(64 << 20), context=NO_CONTEXT,
                                         loading=COMPUTED_FIRST)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    cold = engine.prefill(layout, BLEND).stats.cache.store
    n = 1 + len(PASSAGES)
    assert (cold["gets"], cold["misses"]) == (n, n)
    assert cold["tiers"][0]["bytes_written"] > 0 and cold["tiers"][0]["misses"] == n
    warm = engine.prefill(layout, BLEND).stats.cache.store
    assert (warm["gets"], warm["hits"]) == (n, n)
    assert warm["tiers"][0]["bytes_written"] == 0 and warm["tiers"][0]["hits"] == n
