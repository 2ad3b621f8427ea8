"""Chunk KVs: misses are computed and cached, any subset/order of chunks works, collisions miss."""

from __future__ import annotations

import torch

from blendrag import BlendConfig, MemoryKVStore
from helpers.tiny import PASSAGES, PREFIX, SUFFIX


def test_miss_is_computed_then_hit(engine_for):
    engine = engine_for("llama")
    engine.store = MemoryKVStore()
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    first = engine.prefill(layout, BlendConfig(ratio=0.3)).stats
    assert (first.cache.chunk_hits, first.cache.chunk_misses, first.cache.prefix_hit) == (
        0, 4, False)
    second = engine.prefill(layout, BlendConfig(ratio=0.3)).stats
    assert (second.cache.chunk_hits, second.cache.chunk_misses, second.cache.prefix_hit) == (
        4, 0, True)
    assert len(engine.store) == 5  # prefix + 4 chunks


def test_partially_cached_any_order_equals_fully_cached(engine_for):
    engine = engine_for("llama")
    engine.store = MemoryKVStore()
    prefix_ids = engine.prompts.encode(PREFIX, first=True)
    engine.precompute(prefix_ids, [engine.prompts.encode(PASSAGES[2])])
    layout = engine.build_prompt(PREFIX, [PASSAGES[3], PASSAGES[2], PASSAGES[0]], SUFFIX)
    cfg = BlendConfig(ratio=0.3)
    mixed = engine.prefill(layout, cfg)
    assert (mixed.stats.cache.chunk_hits, mixed.stats.cache.chunk_misses) == (1, 2)
    again = engine.prefill(layout, cfg)
    assert again.stats.cache.chunk_hits == 3
    assert torch.equal(mixed.logits, again.logits)


def test_precompute_skips_existing(engine_for):
    engine = engine_for("llama")
    engine.store = MemoryKVStore()
    prefix_ids = engine.prompts.encode(PREFIX, first=True)
    chunks = [engine.prompts.encode(p) for p in PASSAGES]
    assert engine.precompute(prefix_ids, chunks[:2]) == [True, True]
    assert engine.precompute(prefix_ids, chunks) == [False, False, True, True]


def test_colliding_entry_is_a_miss_not_a_wrong_answer(engine_for):
    engine = engine_for("llama")
    engine.store = MemoryKVStore()
    layout = engine.build_prompt(PREFIX, PASSAGES[:2], SUFFIX)
    good = engine.prefill(layout, BlendConfig(mode="reuse")).logits
    # plant chunk 0's entry under chunk 1's key (as a hash collision would)
    k0 = engine.key(layout.prefix_ids, layout.chunk_ids[0])
    k1 = engine.key(layout.prefix_ids, layout.chunk_ids[1])
    engine.store.put(k1, engine.store.get(k0))
    res = engine.prefill(layout, BlendConfig(mode="reuse"))
    assert res.stats.cache.chunk_misses == 1
    assert torch.allclose(res.logits, good, atol=1e-5)


def test_keys_depend_on_prefix_not_position(engine_for):
    engine = engine_for("llama")
    a = engine.build_prompt(PREFIX, PASSAGES[:2], SUFFIX)
    b = engine.build_prompt(PREFIX, PASSAGES[1::-1], "other suffix")
    c = engine.build_prompt("Another prefix\n", PASSAGES[:2], SUFFIX)
    assert engine.key(a.prefix_ids, a.chunk_ids[1]) == engine.key(b.prefix_ids, b.chunk_ids[0])
    assert engine.key(a.prefix_ids, a.chunk_ids[1]) != engine.key(c.prefix_ids, c.chunk_ids[1])


def test_canonical_chunk_prefix_blends_exactly_at_ratio_one(model_dir):
    """Chunks ingested after a canonical prefix serve requests with another prefix: the request
    prefix stays exact, chunk rows come from the canonical-prefix KVs, ratio 1.0 == full."""
    from blendrag import BlendEngine

    engine = BlendEngine.from_pretrained(model_dir("llama"), chunk_prefix="Documents:\n", chat=True)
    assert engine.ingest(PASSAGES) == [True] * 4
    layout = engine.build_prompt("Use the context to answer.\n", PASSAGES, SUFFIX)
    assert layout.chunk_prefix_ids != layout.prefix_ids
    blend = engine.prefill(layout, BlendConfig(ratio=1.0))
    assert blend.stats.cache.chunk_hits == 4 and blend.stats.cache.chunk_misses == 0
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    assert (blend.logits - full).abs().max() < 1e-4
    # exact prefix only
    assert engine.prefill(layout, BlendConfig(mode="prefix")).stats.cache.chunk_misses == 1
