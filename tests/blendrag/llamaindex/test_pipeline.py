"""End to end: IngestionPipeline -> ChromaVectorStore -> query engine -> BlendLLM."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.response.schema import Response, StreamingResponse
from llama_index.core.ingestion import IngestionCache, IngestionPipeline
from llama_index.core.schema import MetadataMode

from blendrag import BlendConfig
from blendrag.engine.caches.profile import profiled
from blendrag.llamaindex import BlendKVTransform, BlendLLM, BlendSynthesizer, blend_query_engine
from helpers.li_data import QUESTION, cached

TOP_K = 3


def ingest(llm, embed, vector_store, nodes, cache=None) -> VectorStoreIndex:
    pipeline = IngestionPipeline(transformations=[BlendKVTransform(llm), embed],
                                 vector_store=vector_store, cache=cache)
    pipeline.run(nodes=nodes)
    return VectorStoreIndex.from_vector_store(vector_store, embed_model=embed)


def test_pipeline_stores_one_kv_per_node_and_query_reuses_them(make_llm, embed, new_vector_store,
                                                               nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), nodes)
    assert cached(llm, nodes) == [True] * len(nodes)
    assert len(llm.engine.store) == len(nodes) + 1  # + the canonical chunk prefix (BOS)

    response = blend_query_engine(index, llm, similarity_top_k=TOP_K).query(QUESTION)
    stats = llm.last_stats
    assert isinstance(response, Response) and len(response.source_nodes) == TOP_K
    assert (stats.mode, stats.prompt.chunks, stats.cache.chunk_hits, stats.cache.chunk_misses) == (
        "blend",
        TOP_K,
        TOP_K,
        0,
    )
    assert 0 < stats.recompute_fraction < 1
    # + the query prompt's own prefix; no chunk computed
    assert len(llm.engine.store) == len(nodes) + 2


def _synthesize(llm, index, config: BlendConfig):
    variant = BlendLLM(llm.engine, text_index=llm.text_index,
                       generation_config=llm.generation_config(),
                       blend_config=config, chunk_template=llm.chunk_template,
                       chunk_separator=llm.chunk_separator)
    retrieved = index.as_retriever(similarity_top_k=TOP_K).retrieve(QUESTION)
    text = BlendSynthesizer(llm=variant).synthesize(QUESTION, retrieved).response
    return text, variant.last_stats


def test_ratio_one_equals_full_prefill_and_reuse_does_not(make_llm, embed, new_vector_store, nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), nodes)
    full, full_stats = _synthesize(llm, index, BlendConfig(mode="full"))
    blend, blend_stats = _synthesize(llm, index, BlendConfig(mode="blend", ratio=1.0))
    reuse, _ = _synthesize(llm, index, BlendConfig(mode="reuse"))
    assert blend == full
    assert (blend_stats.cache.chunk_hits, blend_stats.recompute_fraction) == (TOP_K, 1.0)
    assert full_stats.mode == "full" and full_stats.cache.chunk_hits == 0
    # The tiny model is sensitive to cross-chunk attention: the equality above is not vacuous.
    assert reuse != full


def test_streaming_text_equals_non_streaming(make_llm, embed, new_vector_store, nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), nodes)
    plain = blend_query_engine(index, llm, similarity_top_k=TOP_K).query(QUESTION).response
    streamed = blend_query_engine(index, llm, similarity_top_k=TOP_K,
                                  streaming=True).query(QUESTION)
    assert isinstance(streamed, StreamingResponse)
    assert "".join(streamed.response_gen) == plain and len(plain) > 0
    assert llm.last_stats.cache.chunk_hits == TOP_K  # set once the stream is exhausted
    # RetrieverQueryEngine
    retriever_engine = blend_query_engine(index.as_retriever(similarity_top_k=TOP_K), llm)
    assert retriever_engine.query(QUESTION).response == plain


def test_async_query_and_stream_equal_sync(make_llm, embed, new_vector_store, nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), nodes)
    plain = blend_query_engine(index, llm, similarity_top_k=TOP_K).query(QUESTION).response

    async def run() -> tuple[str, str]:
        text = (await blend_query_engine(index, llm,
                                         similarity_top_k=TOP_K).aquery(QUESTION)).response
        streamed = await blend_query_engine(index, llm, similarity_top_k=TOP_K,
                                            streaming=True).aquery(QUESTION)
        return text, "".join([t async for t in streamed.async_response_gen()])

    assert asyncio.run(run()) == (plain, plain)


def test_ingestion_cache_skips_the_transform_only_when_nothing_is_lost(
    make_llm, embed, new_vector_store, nodes
):
    cache = IngestionCache()
    first = make_llm()
    index = ingest(first, embed, new_vector_store(), nodes, cache=cache)
    expected = blend_query_engine(index, first, similarity_top_k=TOP_K).query(QUESTION).response
    ingest(first, embed, new_vector_store(), nodes, cache=cache)  # same LLM: a cache hit
    assert cached(first, nodes) == [True] * len(nodes)

    # Same model, new in-memory KV store and text index (e.g. a new process): the transform's
    # cache key names where KVs and texts live, so it is not skipped and nothing is missing.
    second = make_llm()
    assert BlendKVTransform(second).persistence != BlendKVTransform(first).persistence
    index = ingest(second, embed, new_vector_store(), nodes, cache=cache)
    assert cached(second, nodes) == [True] * len(nodes) and len(second.text_index) > 0
    engine = blend_query_engine(index, second, similarity_top_k=TOP_K)
    assert engine.query(QUESTION).response == expected
    assert (second.last_stats.cache.chunk_misses, second.last_stats.cache.chunk_hits) == (0, TOP_K)


def test_metadata_kv_covers_exact_llm_text(make_llm, embed, new_vector_store, metadata_nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), metadata_nodes)
    retrieved = index.as_retriever(similarity_top_k=TOP_K).retrieve(QUESTION)
    for hit in retrieved:
        text = hit.node.get_content(metadata_mode=MetadataMode.LLM)
        assert text.startswith("title: Passage ") and "page" not in text
        assert llm.chunk_text(hit) == text + "\n\n"
    assert cached(llm, retrieved) == [True] * TOP_K  # Chroma round trip keeps the LLM-mode text

    full, _ = _synthesize(llm, index, BlendConfig(mode="full"))
    blend, stats = _synthesize(llm, index, BlendConfig(mode="blend", ratio=1.0))
    assert blend == full and (stats.cache.chunk_hits, stats.cache.chunk_misses) == (TOP_K, 0)


def test_stock_synthesizer_flat_prompt_finds_ingested_chunks(make_llm, embed, new_vector_store,
                                                             nodes):
    llm = make_llm()
    index = ingest(llm, embed, new_vector_store(), nodes)
    # COMPACT: one flat string
    index.as_query_engine(llm=llm, similarity_top_k=TOP_K).query(QUESTION)
    stats = llm.last_stats
    # COMPACT joins the texts with "\n\n": every chunk but the last one matches its precomputed
    # formatted text; the last one is found bare and its KV computed on demand.
    assert (stats.mode, stats.prompt.chunks, stats.cache.chunk_hits, stats.cache.chunk_misses) == (
        "blend",
        TOP_K,
        TOP_K - 1,
        1,
    )


def test_chat_template_engine_blends_at_node_boundaries(make_llm, embed, new_vector_store, nodes):
    llm = make_llm(chat=True)
    assert llm.metadata.is_chat_model
    index = ingest(llm, embed, new_vector_store(), nodes)
    full, _ = _synthesize(llm, index, BlendConfig(mode="full"))
    blend, stats = _synthesize(llm, index, BlendConfig(mode="blend", ratio=1.0))
    assert blend == full and (stats.cache.chunk_hits, stats.cache.chunk_misses) == (TOP_K, 0)

    # stock: llm.chat(messages)
    index.as_query_engine(llm=llm, similarity_top_k=TOP_K).query(QUESTION)
    assert llm.last_stats.cache.chunk_hits == TOP_K - 1


def _entry(llm, node):
    engine = llm.engine
    return engine.store.get(engine.key(engine.prompts.chunk_prefix_ids(),
                                       engine.prompts.encode(llm.chunk_text(node))))


def test_profile_transform_stores_profiles_in_pipeline_order_and_queries_measure_none(
        make_llm, embed, new_vector_store, nodes):
    import torch

    llm = make_llm()
    pipeline = IngestionPipeline(transformations=[BlendKVTransform(llm, profile=True), embed],
                                 vector_store=(store := new_vector_store()))
    pipeline.run(nodes=nodes)
    engine, prefix_ids = llm.engine, llm.engine.prompts.chunk_prefix_ids()
    for i, node in enumerate(nodes):  # after the node before it (the first after the last)
        got = _entry(llm, node).profile
        before = engine.prompts.encode(llm.chunk_text(nodes[i - 1]))
        assert got is not None and got.max() > 0
        assert torch.equal(got,
                           profiled(engine.runner, _entry(llm, node), prefix_ids, [before]).profile)
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed)
    _, stats = _synthesize(llm, index, BlendConfig(selector="profile", ratio=0.3))
    assert (stats.selector, stats.cache.chunk_hits, stats.cache.chunk_misses,
            stats.cache.profiles_computed) == ("profile", TOP_K, 0, 0)


def test_transform_without_profile_stores_none_and_profile_is_in_the_cache_key(
    make_llm, embed, new_vector_store, nodes
):
    from llama_index.core.ingestion.pipeline import get_transformation_hash

    llm = make_llm()
    plain = BlendKVTransform(llm)
    assert plain.profile is False and BlendKVTransform(llm, profile=True).profile is True
    assert BlendKVTransform(llm, profile=3).profile == 3
    assert get_transformation_hash(nodes,
                                   BlendKVTransform(llm, profile=3)) != get_transformation_hash(
        nodes, BlendKVTransform(llm, profile=True))
    with pytest.raises(ValueError, match="profile must be"):
        BlendKVTransform(llm, profile=-1)
    assert get_transformation_hash(nodes, plain) != get_transformation_hash(
        nodes, BlendKVTransform(llm, profile=True)
    )
    index = ingest(llm, embed, new_vector_store(), nodes)
    assert all(_entry(llm, n).profile is None for n in nodes)
    _, stats = _synthesize(llm, index, BlendConfig(selector="profile", ratio=0.3))
    assert stats.cache.profiles_computed == TOP_K  # measured at the first query instead


def test_default_chunk_format_finds_every_chunk_of_a_stock_prompt(
    make_llm, embed, new_vector_store, nodes
):
    """The shared default ("{text}" joined with "\n\n") is what LlamaIndex's synthesizers render:
    a stock query engine's prompt holds every node verbatim, and the separators between them were
    ingested too; BlendSynthesizer writes the same layout."""
    from blendrag.llamaindex import DEFAULT_CHUNK_TEMPLATE, DEFAULT_SEPARATOR

    llm = make_llm(chunk_template=DEFAULT_CHUNK_TEMPLATE, chunk_separator=DEFAULT_SEPARATOR)
    index = ingest(llm, embed, new_vector_store(), nodes)
    assert len(llm.engine.store) == len(nodes) + 2  # + the chunk prefix and the separator
    # COMPACT: one flat string
    index.as_query_engine(llm=llm, similarity_top_k=TOP_K).query(QUESTION)
    stats = llm.last_stats
    assert (stats.prompt.chunks, stats.cache.chunk_hits, stats.cache.chunk_misses) == (
        2 * TOP_K - 1, 2 * TOP_K - 1, 0)
    full, _ = _synthesize(llm, index, BlendConfig(mode="full"))
    blend, stats = _synthesize(llm, index, BlendConfig(mode="blend", ratio=1.0))
    assert blend == full and (stats.prompt.chunks, stats.cache.chunk_hits,
                              stats.cache.chunk_misses) == (2 * TOP_K - 1,) * 2 + (0,)
