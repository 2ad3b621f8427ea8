"""An engine's namespace views: one budget for the prefix and history caches of them all (no row
ever crossing namespaces), unused views dropped, views that follow the engine's store, and no
tenant in the store's public namespace."""

from __future__ import annotations

import dataclasses
import gc
import weakref

import pytest
import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.engine.caches.history import Segment
from blendrag.engine.caches.prefix_cache import Block, _stored_key
from blendrag.engine.views import MAX_VIEWS
from blendrag.store import StoreConfig, TieredKVStore
from blendrag.store.ram import MemoryKVStore
from helpers.kvgen import make_kv, same_bits
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

pytestmark = pytest.mark.usefixtures("one_thread")

MIB = 1 << 20
FULL = BlendConfig(mode="full")
# long enough after the last chunk for the history cache to keep it (>= 16 tokens)
CHAT = "\nUser: who scored twice for Argentina, and who answered with a header?\nAnswer:"


def _engine(model_dir, store=None, **kw) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=NO_CONTEXT, store=store, **kw)


def _held_bytes() -> int:
    """Bytes of every prefix-cache block and history segment alive in this process (each
    tensor counted once, whichever cache holds it)."""
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        if type(obj) in (Block, Segment):  # type(): no lazy module attribute is touched
            for t in (obj.k, obj.v):
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def test_forty_namespaces_share_one_budget_and_never_each_others_rows(model_dir):
    gc.collect()
    before = _held_bytes()  # what other tests of this worker process still hold
    engine = _engine(model_dir, prefix_cache_bytes=MIB, history_bytes=MIB)
    layout = engine.build_prompt(PREFIX, PASSAGES, CHAT)
    views = [engine.namespaced(f"tenant-{i}") for i in range(40)]
    for view in views:
        view.prefill(layout, FULL)
    held = _held_bytes() - before
    # one budget each for the prefix and the history cache, whatever the number of views
    # (each view had budgets of its own: 40 namespaces held 11 MiB)
    assert 0 < held <= 2 * MIB
    assert engine.prefix_cache.bytes <= MIB and engine.history.bytes <= MIB
    assert {v.prefix_cache.bytes for v in views} == {engine.prefix_cache.bytes}
    # the most recent tenant finds its own rows; a new one none of anyone's
    own = views[-1].prefill(layout, FULL).stats.cache
    fresh = engine.namespaced("newcomer").prefill(layout, BlendConfig(ratio=0.3)).stats.cache
    assert own.prefix_cache_tokens > layout.num_tokens // 2
    assert fresh.prefix_cache_tokens == 0 and fresh.history_tokens == 0
    assert fresh.chunk_hits == 0


def test_a_view_keeps_its_rows_apart_in_the_shared_pool(model_dir):
    engine = _engine(model_dir, prefix_cache_bytes=64 * MIB)
    a, b = engine.namespaced("a"), engine.namespaced("b")
    layout = engine.build_prompt(PREFIX, PASSAGES, CHAT)
    a.prefill(layout, FULL)
    held = len(engine.prefix_cache)
    assert held > 0 and len(a.prefix_cache) == held  # one pool: every view sees its size
    assert b.prefill(layout, FULL).stats.cache.prefix_cache_tokens == 0
    assert a.prefill(layout, FULL).stats.cache.prefix_cache_tokens > 0
    assert engine.prefill(layout, FULL).stats.cache.prefix_cache_tokens == 0  # "" is apart too


def test_unused_views_are_dropped_and_held_ones_kept(model_dir):
    engine = _engine(model_dir, prefix_cache_bytes=MIB)
    held = engine.namespaced("held")
    early = weakref.ref(engine.namespaced("early"))
    for i in range(MAX_VIEWS + 8):
        engine.namespaced(f"passer-{i}")
    gc.collect()
    assert early() is None  # neither held nor among the most recent: dropped
    assert engine.namespaced("held") is held
    assert engine.namespaced(f"passer-{MAX_VIEWS + 7}") is engine.namespaced(
        f"passer-{MAX_VIEWS + 7}")
    assert held.namespaced("") is engine


def test_views_follow_the_engines_store(model_dir):
    first, second = MemoryKVStore(64 * MIB), MemoryKVStore(64 * MIB)
    engine = _engine(model_dir, first, prefix_cache_bytes=MIB, prefix_cache_store=True)
    a = engine.namespaced("a")
    engine.store = second
    assert a.store.namespace == "a" and engine.namespaced("a") is a
    a.store.put("chunk", make_kv(1))
    assert same_bits(second.namespaced("a").get("chunk"), make_kv(1))
    assert first.namespaced("a").get("chunk") is None
    # the prefix caches keep their blocks in the new store too
    assert engine.prefix_cache.store is second and a.prefix_cache.store is a.store
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    a.prefill(layout, FULL)
    assert first.bytes == 0 and second.bytes > 0


def test_a_tenant_never_gets_the_public_namespace_the_job_writes(model_dir):
    config = StoreConfig(ram_bytes=64 * MIB, disk_dir=None, namespace="acme",
                         public_namespace="public")
    engine = _engine(model_dir, TieredKVStore(config))
    with pytest.raises(ValueError, match="public_namespace"):
        engine.namespaced("public")
    other = engine.namespaced("globex")
    with pytest.raises(ValueError, match="public_namespace"):
        other.namespaced("public")
    # the ingestion job writes the corpus through the store's view of it; tenants read it
    job = _engine(model_dir, engine.store.namespaced("public"))
    job.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    for tenant in (engine, other):
        assert tenant.prefill(layout, BlendConfig(ratio=0.3)).stats.cache.chunk_hits == len(
            PASSAGES)
    # a store whose public namespace is a view's already: refused, nothing changed
    held = engine.namespaced("public-2")
    with pytest.raises(ValueError, match="public_namespace"):
        engine.store = TieredKVStore(StoreConfig(ram_bytes=MIB, disk_dir=None,
                                                 public_namespace="public-2"))
    assert held.store.namespace == "public-2" and engine.store.namespace == "acme"
    engine.store.close()


def test_a_stored_block_of_another_shape_is_a_miss_and_the_request_a_full_prefill(model_dir,
                                                                                   tmp_path,
                                                                                   caplog):
    config = StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv", kv_format="model")
    writer = _engine(model_dir, TieredKVStore(config), prefix_cache_bytes=MIB,
                     prefix_cache_store=True)
    layout = writer.build_prompt(PREFIX, PASSAGES, SUFFIX)
    writer.prefill(layout, FULL)
    bad = 0
    for key in writer.prefix_cache.chain(layout.ids[:-1]):
        name = _stored_key(key, True)
        kv = writer.store.get(name)
        assert kv is not None
        k = torch.cat([kv.keys, kv.keys[:, :1]], dim=1)  # one KV head too many
        v = torch.cat([kv.values, kv.values[:, :1]], dim=1)
        writer.store.put(name, dataclasses.replace(kv, keys=k, values=v), exact=True)
        bad += 1
    assert bad > 0
    reader = _engine(model_dir, TieredKVStore(config), prefix_cache_bytes=MIB,
                     prefix_cache_store=True)
    with caplog.at_level("WARNING"):
        pre = reader.prefill(layout, FULL)  # raised RuntimeError in the layer loop before
    assert pre.stats.cache.prefix_cache_tokens == 0
    assert reader.prefix_cache.refused >= 1 and "prefix-cache block" in caplog.text
    ref = _engine(model_dir).prefill(layout, FULL)
    assert torch.allclose(pre.logits, ref.logits, atol=1e-5)
    writer.store.close()
    reader.store.close()
