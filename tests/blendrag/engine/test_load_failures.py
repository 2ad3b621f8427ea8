"""Cached rows that fail to load, and chunks too long for the ingestion context: a request
with 100 damaged entries pays one retry that computes each chunk once (never an attempt per
entry), and a chunk that does not fit after the fillers is computed, stored and found after
the chunk prefix alone, with a warning, at positions the model has."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
import torch

from blendrag import BlendConfig, BlendEngine
from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
from blendrag.store.disk import DiskTier
from helpers.tiny import COMPUTED_FIRST, PREFIX, SUFFIX

BLEND = BlendConfig(selector="cacheblend", ratio=0.3)
CHUNKS = [f"fact {i}." for i in range(100)]


def _damage_layer(path, layer: int) -> None:
    """Flip one byte inside ``k.{layer}`` of the entry file (a safetensors file): its checksum
    then fails when that layer is read, the header and other layers intact."""
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    start, end = json.loads(data[8:8 + header_len])[f"k.{layer}"]["data_offsets"]
    data[8 + header_len + (start + end) // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _counting(engine: BlendEngine) -> list[tuple[int, ...]]:
    """Record the chunk computations of ``engine``: the ids of each ``compute_pair`` call."""
    calls: list[tuple[int, ...]] = []
    compute = engine.cache.compute_pair

    def counted(*args, **kw):
        calls.append(tuple(args[2]))
        return compute(*args, **kw)

    engine.cache.compute_pair = counted  # type: ignore[method-assign]
    return calls


def test_a_hundred_entries_with_a_bad_layer_cost_one_retry(engine_for, make_store, tmp_path,
                                                           one_thread):
    store = make_store(ram_bytes=0, disk_bytes=64 << 20)
    engine = engine_for("llama", layers=4)
    engine.store = store
    layout = engine.build_prompt(PREFIX, CHUNKS, SUFFIX)
    engine.precompute(layout.chunk_prefix_ids, layout.chunk_ids)
    disk = DiskTier(store.config.disk_dir, None)
    keys = [engine.key(layout.chunk_prefix_ids, ids) for ids in layout.chunk_ids]
    for key in keys:
        _damage_layer(disk.entry_path(key), layer=1)

    cold = engine_for("llama", layers=4)  # an empty store: every chunk computed once, stored
    cold.store = make_store(ram_bytes=0, disk_bytes=64 << 20, disk_dir=tmp_path / "cold")
    ref = cold.prefill(layout, BLEND)
    computed = _counting(engine)
    pre = engine.prefill(layout, BLEND)

    assert torch.equal(pre.logits, ref.logits)
    assert pre.stats.cache.load_retries == 1  # every bad entry found in the first attempt
    # each chunk computed exactly once, not once per attempt, and nothing else computed
    each_once = Counter(tuple(ids) for ids in layout.chunk_ids)
    assert set(each_once.values()) == {1}  # the chunks are distinct
    assert Counter(computed) == each_once
    assert pre.stats.cache.chunk_misses == len(CHUNKS)
    assert store.stats().tier("disk").corrupt == len(CHUNKS)  # their bytes were bad: dropped
    again = engine.prefill(layout, BLEND)  # the recomputed rows were stored again
    assert again.stats.cache.load_retries == 0
    assert again.stats.cache.chunk_hits == len(CHUNKS)
    assert torch.equal(again.logits, ref.logits)


@pytest.fixture
def long_chunk_engine(model_dir):
    """An engine with the default ingestion context (fillers) on a 1,024-position model."""
    # the request computes the long chunk itself (the fallback tested), not the backfill
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       context=ChunkContext(), loading=COMPUTED_FIRST)


def test_a_chunk_too_long_for_the_fillers_is_computed_without_them(long_chunk_engine, caplog,
                                                                    one_thread):
    engine = long_chunk_engine
    prefix_ids = engine.prompts.encode(PREFIX)
    fillers = max(len(engine.prompts.encode(f)) for f in engine.cache.context.fillers)
    room = engine.runner.max_positions - len(prefix_ids) - fillers
    long_ids = [5 + i % 300 for i in range(room + 40)]
    short_ids = engine.prompts.encode("fact 1.")
    layout = _layout(engine, prefix_ids, [short_ids, long_ids])
    with caplog.at_level(logging.WARNING, logger="blendrag.engine"):
        pre = engine.prefill(layout, BLEND)
        engine.prefill(layout, BLEND)
    warned = [r for r in caplog.records if "does not fit the model's context" in r.getMessage()]
    assert len(warned) == 1  # said once, not per request
    assert pre.stats.cache.chunks_without_context == 1
    assert engine.store.contains(engine.cache.key(prefix_ids, long_ids, NO_CONTEXT))
    assert not engine.store.contains(engine.cache.key(prefix_ids, long_ids, engine.cache.context))
    assert engine.key(prefix_ids, long_ids) == engine.cache.key(prefix_ids, long_ids, NO_CONTEXT)
    # the short chunk keeps its context
    assert engine.key(prefix_ids, short_ids) != engine.cache.key(prefix_ids, short_ids,
                                                                 NO_CONTEXT)
    # ingestion stores it under the key a request looks for: the next request hits it
    fresh = BlendEngine(engine.model, engine.tokenizer, chat=False, context=ChunkContext())
    fresh.precompute(prefix_ids, [short_ids, long_ids])
    hit = fresh.prefill(layout, BLEND)
    assert (hit.stats.cache.chunk_hits, hit.stats.cache.chunk_misses) == (2, 0)
    assert torch.equal(hit.logits, pre.logits)


def _layout(engine: BlendEngine, prefix_ids, chunks):
    from blendrag import PromptLayout

    return PromptLayout(prefix_ids, chunks, engine.prompts.encode(SUFFIX), prefix_ids)


def test_ingest_on_a_short_context_model(model_dir):
    engine = BlendEngine.from_pretrained(model_dir("llama", positions=128), device="cpu",
                                         chat=False, context=ChunkContext())
    # the fillers are longer than the whole context: chunks are stored without them
    assert engine.ingest(["fact 1."], prefix=PREFIX) == [True]
    with pytest.raises(ValueError, match=r"longer than the \d+ the model's context of 128"):
        engine.ingest(["w " * 200], prefix=PREFIX)
    with pytest.raises(ValueError, match="chunk prefix takes .* of the model's context of 128 "
                                         "positions: no room"):
        engine.ingest(["fact 1."], prefix="long prefix " * 100)
