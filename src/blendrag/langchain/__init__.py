"""LangChain integration: blended prefill behind LangChain's LLM and chat-model interfaces.

- :class:`BlendLLM` (``BaseLLM``) and :class:`ChatBlend` (``BaseChatModel``) run one
  :class:`~blendrag.BlendEngine`. They blend the cached KVs of the retrieved chunks into the
  prompt, whether the chain passes the Documents (``documents=``) or only the flat prompt
  (the chunks are then found through the
  :class:`~blendrag.integration.text_index.ChunkTextIndex` that the ingestion hook fills).
- :func:`create_blend_retrieval_chain`: ``create_retrieval_chain`` that hands the retrieved
  Documents to the model.
- :class:`BlendChroma` (needs ``blendrag[chroma]``): a ``langchain_chroma.Chroma`` that also
  precomputes the KV of every text added to it.

Install with ``pip install blendrag[langchain]``.
"""

from __future__ import annotations

from typing import Any

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a test by hiding the module
    raise ImportError(
        "blendrag.langchain needs LangChain (langchain-core, langchain-classic): "
        "pip install blendrag[langchain]"
    ) from exc

from blendrag.langchain.chain import create_blend_retrieval_chain
from blendrag.langchain.chat import ChatBlend
from blendrag.langchain.llm import BlendLLM

__all__ = ["BlendChroma", "BlendLLM", "ChatBlend", "SentenceTransformerEmbeddings",
           "create_blend_retrieval_chain"]


def __getattr__(name: str) -> Any:
    # Chroma and sentence-transformers are optional extras: import them only when asked for.
    if name == "BlendChroma":
        from blendrag.langchain.chroma import BlendChroma

        return BlendChroma
    if name == "SentenceTransformerEmbeddings":
        from blendrag.langchain.embeddings import SentenceTransformerEmbeddings

        return SentenceTransformerEmbeddings
    raise AttributeError(f"module 'blendrag.langchain' has no attribute {name!r}")
