"""The precompute job: computes each missing chunk once, exactly, outside the RAM tier; resumable."""

from __future__ import annotations

import pytest
import torch
from test_precompute_sources import DOCS, make_chroma
from tiny import PASSAGES, PREFIX

from blendrag import BlendEngine, MemoryKVStore
from blendrag.ingest import chunks_from_chroma, chunks_from_folder, kv_bytes_per_token, precompute
from blendrag.text_index import ChunkTextIndex

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def engine(model_dir, make_store) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, store=make_store())


def _key(engine: BlendEngine, text: str) -> str:
    return engine.key(engine.prompts.kv_prefix_ids(PREFIX), engine.prompts.encode(text))


def test_every_chunk_is_stored_exactly_and_counted(engine, tmp_path):
    for i, text in enumerate([*PASSAGES, ""]):
        (tmp_path / f"{i}.txt").write_text(text)
    summary = precompute(engine, chunks_from_folder(tmp_path), prefix=PREFIX, progress=False)
    tokens = sum(len(engine.prompts.encode(t)) for t in PASSAGES)
    assert (summary.chunks, summary.computed, summary.skipped, summary.empty) == (5, 4, 0, 1)
    assert (summary.tokens, summary.bytes) == (tokens, tokens * kv_bytes_per_token(engine))
    assert summary.tokens_per_s > 0 and "computed 4" in summary.format()
    prefix_ids = engine.prompts.kv_prefix_ids(PREFIX)
    prefix = engine.prefix_kv(prefix_ids)
    for text in PASSAGES:
        stored = engine.store.get(_key(engine, text))
        ref = engine._chunk_prefill(prefix, prefix_ids, engine.prompts.encode(text))
        assert torch.equal(stored.keys, ref.keys) and torch.equal(stored.values, ref.values)


def test_bulk_entries_skip_the_ram_tier(engine):
    precompute(engine, PASSAGES, prefix=PREFIX, progress=False)
    stats = engine.store.stats()
    assert stats.tier("ram").entries == 1  # the prefix only: the serving working set stays
    assert stats.tier("disk").entries == 1 + len(PASSAGES)


def test_a_ram_only_store_still_gets_the_entries(model_dir):
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False, store=MemoryKVStore())
    assert precompute(engine, PASSAGES, prefix=PREFIX, progress=False).computed == 4
    assert len(engine.store) == 5


def test_resumes_where_it_stopped_and_repeats_are_computed_once(engine):
    first = precompute(engine, PASSAGES[:2], prefix=PREFIX, progress=False, batch_size=1)
    assert (first.computed, first.skipped) == (2, 0)
    again = precompute(engine, [*PASSAGES, PASSAGES[3]], prefix=PREFIX, progress=False, batch_size=3)
    assert (again.chunks, again.computed, again.skipped) == (5, 2, 3)
    last = precompute(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert (last.computed, last.skipped, last.tokens) == (0, 4, 0)


def test_from_chroma_records_texts_in_the_index(engine, tmp_path):
    make_chroma(tmp_path / "chroma", DOCS)
    index = ChunkTextIndex(tmp_path / "index")
    summary = precompute(engine, chunks_from_chroma(tmp_path / "chroma", "docs", page_size=2), prefix=PREFIX,
                         progress=False, text_index=index)
    assert summary.computed == len(DOCS)
    assert all(engine.store.contains(_key(engine, d)) for d in DOCS)
    assert all(d in ChunkTextIndex(tmp_path / "index") for d in DOCS)  # persisted


def test_needs_a_prefix_or_a_chunk_prefix(engine):
    with pytest.raises(ValueError, match="no chunk prefix"):
        precompute(engine, PASSAGES, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        precompute(engine, PASSAGES, prefix=PREFIX, batch_size=0)
