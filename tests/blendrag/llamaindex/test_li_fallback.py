"""LlamaIndex side of a request that finds no known chunk: one warning naming the cause and the
fix, a counter, ``strict``, and every response (and callback payload) saying what happened."""

from __future__ import annotations

import logging

import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.callbacks.schema import EventPayload

from blendrag.integration.fallback import NoChunkFoundError
from helpers.li_data import QUESTION

WARNING = "found no known chunk"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and WARNING in r.getMessage()]


def test_index_built_without_the_transform_warns_once_and_strict_raises(
        make_llm, embed, new_vector_store, nodes, caplog):
    from llama_index.core import StorageContext

    llm = make_llm()
    storage = StorageContext.from_defaults(vector_store=new_vector_store())
    index = VectorStoreIndex(nodes, storage_context=storage, embed_model=embed)
    engine = index.as_query_engine(llm=llm, similarity_top_k=2)  # stock synthesizer
    with caplog.at_level(logging.WARNING):
        engine.query(QUESTION)
        engine.query(QUESTION)
    (message,) = _warnings(caplog)
    assert "text index is empty" in message and "BlendKVTransform(llm)" in message
    # the user built a VectorStoreIndex: the fix names that path, not only a pipeline
    assert "VectorStoreIndex.from_documents(docs, transformations=[...])" in message
    assert llm.fallbacks >= 2 and llm.last_stats.mode == "full"

    strict = make_llm(strict=True)
    with pytest.raises(NoChunkFoundError, match="BlendKVTransform"):
        index.as_query_engine(llm=strict, similarity_top_k=2).query(QUESTION)


def test_responses_and_callbacks_carry_what_happened(make_llm, nodes):
    debug = LlamaDebugHandler()
    llm = make_llm(callback_manager=CallbackManager([debug]))
    fmt = llm.client.chunk_format
    chunks = [fmt.format(n.text) for n in nodes[:2]]
    prompt = "Context:\n" + fmt.join(chunks) + f"\nQuestion: {QUESTION}\nAnswer:"
    response = llm.complete(prompt, nodes=nodes[:2])
    assert response.raw["blended"] is True and response.additional_kwargs["blended"] is True
    prompt_info = response.raw["prompt"]
    assert prompt_info["matched_chunks"] == 2 and prompt_info["fallback"] is None
    stats = response.raw["stats"]
    assert stats["mode"] == "blend" and stats["chunk_hits"] + stats["chunk_misses"] == 2
    assert 0 < stats["recompute_fraction"] < 1 and stats["ttft_s"] > stats["match_s"] > 0

    *_, last = llm.stream_complete("A prompt with no known chunk in it.")
    assert last.raw["blended"] is False and last.raw["prompt"]["fallback"] == "not_in_prompt"
    assert llm.fallbacks == 1
    payloads = [end.payload[EventPayload.COMPLETION] for _, end in
                debug.get_event_pairs(CBEventType.LLM)]
    assert [p.raw["blended"] for p in payloads] == [True, False]


def test_an_index_over_no_documents_says_so_when_it_is_built(make_llm, embed, caplog):
    from blendrag.llamaindex import BlendKVTransform

    llm = make_llm()
    with caplog.at_level(logging.WARNING):
        VectorStoreIndex.from_documents([], transformations=[BlendKVTransform(llm)],
                                        embed_model=embed)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1
    assert said[0].startswith("BlendKVTransform got no nodes: nothing to ingest. Either the "
                              "reader loaded no document")
    # the other way to get none: a pipeline's docstore skipping what an earlier run ingested
    assert "docstore" in said[0] and "persistent store" in said[0]


def test_a_prompt_without_passages_is_a_full_prefill_by_design(make_llm, nodes, caplog):
    from blendrag.llamaindex import BlendKVTransform

    llm = make_llm(max_tokens=2)
    BlendKVTransform(llm)(nodes)  # an index with passages, none of them in the prompt
    with caplog.at_level(logging.WARNING):
        llm.complete("Say hi.")
    (message,) = _warnings(caplog)
    assert "none of the" in message and "ingested chunk texts is in the prompt" in message
    fix = message[message.index("Fix: "):]
    assert fix.startswith("Fix: a prompt without retrieved passages is a full prefill by design "
                          "(BlendLLM(..., mode='full') or complete(..., mode='full') says so")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        make_llm(max_tokens=2).complete("Say hi.", mode="full")  # asked for: no warning
    assert not _warnings(caplog)
