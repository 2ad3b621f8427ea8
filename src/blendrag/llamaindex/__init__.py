"""LlamaIndex integration: an LLM, a response synthesizer and an ingestion transform over
one :class:`~blendrag.BlendEngine`.

>>> llm = BlendLLM.from_pretrained("path/to/model")
>>> steps = [BlendKVTransform(llm), embed_model]
>>> pipeline = IngestionPipeline(transformations=steps, vector_store=store)
>>> pipeline.run(documents=docs)  # node KVs precomputed once
>>> blend_query_engine(VectorStoreIndex.from_vector_store(store, embed_model), llm).query("...")

Requires ``pip install blendrag[llamaindex]``; see docs/llamaindex.md.
"""

from __future__ import annotations

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test that hides the package
    raise ImportError(
        "blendrag.llamaindex needs llama-index-core: pip install blendrag[llamaindex]"
    ) from exc

from blendrag.integration.chunks import DEFAULT_CHUNK_TEMPLATE, DEFAULT_SEPARATOR
from blendrag.llamaindex.embeddings import SentenceTransformerEmbeddings
from blendrag.llamaindex.ingestion import BlendKVTransform
from blendrag.llamaindex.llm import BlendLLM
from blendrag.llamaindex.synthesizer import (
    DEFAULT_QA_TEMPLATE,
    BlendSynthesizer,
    blend_query_engine,
)

__all__ = [
    "DEFAULT_CHUNK_TEMPLATE",
    "DEFAULT_QA_TEMPLATE",
    "DEFAULT_SEPARATOR",
    "BlendKVTransform",
    "BlendLLM",
    "BlendSynthesizer",
    "SentenceTransformerEmbeddings",
    "blend_query_engine",
]
