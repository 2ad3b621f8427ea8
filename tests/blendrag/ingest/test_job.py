"""The ingestion job: computes each missing chunk once, exactly, outside the RAM tier;
resumable."""

from __future__ import annotations

import pytest
import torch

from blendrag import NO_CONTEXT, BlendConfig, BlendEngine, MemoryKVStore
from blendrag.engine.caches.profile import profiled
from blendrag.ingest import (
    chunks_from_chroma,
    chunks_from_folder,
    ingest_source,
    kv_bytes_per_token,
)
from blendrag.integration.text_index import ChunkTextIndex
from helpers.sources import DOCS, make_chroma
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, computed

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def engine(model_dir, make_store) -> BlendEngine:
    return BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                       store=make_store(), context=NO_CONTEXT)


def _key(engine: BlendEngine, text: str) -> str:
    return engine.key(engine.prompts.chunk_prefix_ids(PREFIX), engine.prompts.encode(text))


def test_every_chunk_is_stored_exactly_and_counted(engine, tmp_path):
    for i, text in enumerate([*PASSAGES, ""]):
        (tmp_path / f"{i}.txt").write_text(text)
    summary = ingest_source(engine, chunks_from_folder(tmp_path), prefix=PREFIX, progress=False)
    tokens = sum(len(engine.prompts.encode(t)) for t in PASSAGES)
    assert (summary.chunks, summary.computed, summary.skipped, summary.empty) == (5, 4, 0, 1)
    assert (summary.tokens, summary.bytes) == (tokens, tokens * kv_bytes_per_token(engine))
    assert summary.tokens_per_s > 0 and "computed 4" in summary.format()
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    for text in PASSAGES:
        stored = engine.store.get(_key(engine, text))
        ref = computed(engine, prefix_ids, engine.prompts.encode(text))
        assert torch.equal(stored.keys, ref.keys) and torch.equal(stored.values, ref.values)


def test_bulk_entries_skip_the_ram_tier(engine):
    ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    stats = engine.store.stats()
    assert stats.tier("ram").entries == 1  # the prefix only: the serving working set stays
    assert stats.tier("disk").entries == 1 + len(PASSAGES)


def test_a_ram_only_store_still_gets_the_entries(model_dir):
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         store=MemoryKVStore())
    assert ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False).computed == 4
    # the chunk prefix, once more after each filler of the ingestion context, and the chunks,
    # each in context and alone (the exact rows of a first passage)
    assert len(engine.store) == 1 + len(engine.context.fillers) + 2 * 4


def test_resumes_where_it_stopped_and_repeats_are_computed_once(engine):
    first = ingest_source(engine, PASSAGES[:2], prefix=PREFIX, progress=False, batch_size=1)
    assert (first.computed, first.skipped) == (2, 0)
    again = ingest_source(engine, [*PASSAGES, PASSAGES[3]], prefix=PREFIX, progress=False,
                       batch_size=3)
    assert (again.chunks, again.computed, again.skipped) == (5, 2, 3)
    last = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert (last.computed, last.skipped, last.tokens) == (0, 4, 0)


def test_from_chroma_records_texts_in_the_index(engine, tmp_path):
    make_chroma(tmp_path / "chroma", DOCS)
    index = ChunkTextIndex(tmp_path / "index")
    summary = ingest_source(engine, chunks_from_chroma(tmp_path / "chroma", "docs", page_size=2),
                         prefix=PREFIX,
                         progress=False, text_index=index)
    assert summary.computed == len(DOCS)
    assert all(engine.store.contains(_key(engine, d)) for d in DOCS)
    assert all(d in ChunkTextIndex(tmp_path / "index") for d in DOCS)  # persisted


def test_needs_a_prefix_or_a_chunk_prefix(engine):
    with pytest.raises(ValueError, match="no chunk prefix"):
        ingest_source(engine, PASSAGES, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        ingest_source(engine, PASSAGES, prefix=PREFIX, batch_size=0)


# ---- context-sensitivity profiles (profile=True) -----------------------------------------------


def _stored(engine: BlendEngine, text: str):
    return engine.store.get(_key(engine, text))


def _profile_after(engine: BlendEngine, text: str, *neighbours: str) -> torch.Tensor:
    """What the engine measures for ``text`` computed after each of ``neighbours`` (the
    reference)."""
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    probes = [engine.prompts.encode(n) for n in neighbours]
    return profiled(engine.runner, _stored(engine, text), prefix_ids, probes).profile


def test_profiles_follow_source_order_across_batches_and_empty_texts(engine):
    p0, p1, p2, p3 = PASSAGES
    # batches [p0, p1] | ["", p2] | [p3]: p2 and p3 open a batch; their neighbours sit in the
    # one before
    summary = ingest_source(engine, [p0, p1, "", p2, p3], prefix=PREFIX, progress=False,
                            batch_size=2, profile=True)
    assert (summary.chunks, summary.computed, summary.skipped, summary.empty,
            summary.profiled) == (5, 4, 0, 1, 4)
    assert (
        summary.to_dict()["profiled"] == 4
        and "context-sensitivity profiles measured for 4" in summary.format()
    )
    # p0 has no predecessor: the last of its batch (cyclic)
    neighbours = {p0: p1, p1: p0, p2: p1, p3: p2}
    for text, before in neighbours.items():
        got = _stored(engine, text).profile
        assert (
            got is not None
            and got.dtype == torch.float32
            and got.shape == (len(engine.prompts.encode(text)),)
        )
        assert torch.equal(got, _profile_after(engine, text, before)), text
        assert got.max() > 0
    # the served rows are the stand-alone ones, profile or not
    prefix_ids = engine.prompts.chunk_prefix_ids(PREFIX)
    ref = computed(engine, prefix_ids, engine.prompts.encode(p2))
    assert torch.equal(_stored(engine, p2).keys,
                       ref.keys) and torch.equal(_stored(engine, p2).values, ref.values)
    # queries with the profile selector find every profile in the store
    stats = engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
                           BlendConfig(selector="profile")).stats
    assert (stats.cache.chunk_hits, stats.cache.profiles_computed) == (4, 0)


def test_batch_size_does_not_change_the_profiles_after_the_first_chunk(
    engine, model_dir, make_store
):
    ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False, batch_size=1, profile=True)
    whole = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                        store=make_store(disk_dir=None), context=NO_CONTEXT)
    whole.precompute(whole.prompts.chunk_prefix_ids(PREFIX),
                     [whole.prompts.encode(t) for t in PASSAGES], profile=True)
    for text in PASSAGES[1:]:
        assert torch.equal(_stored(engine, text).profile, _stored(whole, text).profile)
    # a first batch of one chunk has no neighbour: no profile (the engine measures it on first use)
    assert _stored(engine, PASSAGES[0]).profile is None


def test_k_neighbours_follow_source_order_across_batches(engine):
    p0, p1, p2, p3 = PASSAGES
    # batches [p0] | [p1] | [p2] | [p3] with profile=2: each batch opens behind the last two
    # chunks so far
    summary = ingest_source(engine, [p0, p1, p2, p3], prefix=PREFIX, progress=False, batch_size=1,
                         profile=2)
    assert (summary.computed, summary.profiled) == (4, 3)
    assert _stored(engine, p0).profile is None  # a first batch of one: no neighbour yet
    assert torch.equal(_stored(engine, p1).profile, _profile_after(engine, p1, p0))
    assert torch.equal(_stored(engine, p2).profile, _profile_after(engine, p2, p1, p0))
    assert torch.equal(_stored(engine, p3).profile, _profile_after(engine, p3, p2, p1))


def test_without_profile_entries_have_none(engine):
    summary = ingest_source(engine, PASSAGES, prefix=PREFIX, progress=False)
    assert summary.profiled == 0 and "profiles" not in summary.format()
    assert all(_stored(engine, t).profile is None for t in PASSAGES)


def test_a_resumed_or_repeating_job_measures_after_the_source_predecessor(engine):
    p0, p1, p2, p3 = PASSAGES
    ingest_source(engine, [p0, p1], prefix=PREFIX, progress=False, profile=True)
    new = "A brand new passage about the history of Oslo and Paris."
    # p0, p1 are skipped, p0 repeats: the neighbours are still the texts just before in the source
    summary = ingest_source(engine, [p0, p1, p0, p2, new], prefix=PREFIX, progress=False,
                            batch_size=2, profile=True)
    assert (summary.chunks, summary.computed, summary.skipped, summary.profiled) == (5, 2, 3, 2)
    assert torch.equal(_stored(engine, p2).profile, _profile_after(engine, p2, p0))
    assert torch.equal(_stored(engine, new).profile, _profile_after(engine, new, p2))
    assert not engine.store.contains(_key(engine, p3))
