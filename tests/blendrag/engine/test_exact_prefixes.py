"""A store that keeps K and V in a lossy format (bfloat16, the default) still stores every prefix
exactly - the chunk prefix and each prefix + filler that chunks are computed after - so a chunk
computed after a stored prefix equals one computed after a fresh one. Without it the entries a
job stores would depend on where its batches start (a prefix computed in one batch is read back
rounded in the next)."""

from __future__ import annotations

import torch

from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
from blendrag.ingest import ingest_source
from blendrag.store import StoreConfig, TieredKVStore
from helpers.tiny import PASSAGES, PREFIX

TEXTS = [p + f" Entry {i}." for i in range(3) for p in PASSAGES]  # 12 distinct chunks


def _ingested(engine_for, tmp_path, name: str, batch_size: int) -> TieredKVStore:
    """A fresh engine on a disk-only store in the default format, the texts ingested in batches
    of ``batch_size`` (no RAM tier: every prefix a later batch needs is read back)."""
    store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / name))
    engine = engine_for("llama", context=ChunkContext())
    engine.store = store
    ingest_source(engine, TEXTS, prefix=PREFIX, progress=False, batch_size=batch_size)
    return store


def test_entries_do_not_depend_on_batch_boundaries(engine_for, tmp_path, one_thread):
    assert StoreConfig(disk_dir=None).kv_format == "bfloat16"
    one_batch = _ingested(engine_for, tmp_path, "one", batch_size=64)
    in_fives = _ingested(engine_for, tmp_path, "fives", batch_size=5)
    keys = one_batch.tiers[0].tier.keys()  # every entry stored
    assert len(keys) > len(TEXTS)  # chunks in context, chunks alone, prefixes
    for key in keys:
        a, b = one_batch.get(key), in_fives.get(key)
        assert b is not None, key
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), key
        if a.context_shift is not None:
            assert torch.equal(a.context_shift, b.context_shift), key


def test_prefixes_are_stored_exactly_and_chunks_in_the_format(engine_for, tmp_path, one_thread):
    store = _ingested(engine_for, tmp_path, "kv", batch_size=64)
    engine = engine_for("llama", context=ChunkContext())
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    fresh = engine.cache.runner.compute_chunk(None, (), prefix_ids)
    stored = store.get(engine.key((), prefix_ids, NO_CONTEXT))
    assert stored is not None and torch.equal(stored.keys, fresh.keys)  # bit for bit
    chunk = store.get(engine.key(prefix_ids, engine.prompts.encode(TEXTS[0])))
    assert chunk is not None
    assert torch.equal(chunk.keys, chunk.keys.to(torch.bfloat16).float())  # bfloat16 values


def test_rows_a_request_counts_as_exact_are_never_rounded(engine_for, tmp_path, one_thread):
    """In a store of the default format: a prefix first met by a request is stored exactly, as
    ingestion stores it; prefix mode's chunk (the mode counts every row as a full prefill's)
    is stored exactly, and one stored rounded before (a chunk's entry computed after this very
    prefix by ingestion) is computed again rather than read rounded: every prefix request
    equals a full prefill."""
    from blendrag import BlendConfig
    from helpers.tiny import SUFFIX

    engine = engine_for("llama")
    engine.store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "kv"))
    layout = engine.build_prompt(PREFIX, PASSAGES[:3], SUFFIX)
    engine.precompute(layout.prefix_ids, layout.chunk_ids[:1])  # chunk 1 stored rounded
    full = engine.prefill(layout, BlendConfig(mode="full")).logits
    for _ in range(2):
        pre = engine.prefill(layout, BlendConfig(mode="prefix"))
        assert (pre.logits - full).abs().max() < 1e-5
    for ids, after in ((layout.prefix_ids, ()), (layout.chunk_ids[0], layout.prefix_ids)):
        entry = engine.store.open_layers(engine.key(after, ids, NO_CONTEXT))
        assert entry is not None and entry.exact  # stored in the model's dtype
        entry.close()
    other = engine_for("llama")  # a prefix first met by a request, in a store of its own
    other.store = TieredKVStore(StoreConfig(ram_bytes=0, disk_dir=tmp_path / "other"))
    other.prefill(layout, BlendConfig(mode="reuse"))
    entry = other.store.open_layers(other.key((), layout.prefix_ids, NO_CONTEXT))
    assert entry is not None and entry.exact
    entry.close()
