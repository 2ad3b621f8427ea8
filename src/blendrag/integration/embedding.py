"""Sentence-transformers embedders loaded from a local directory (never from a hub).

Both frameworks' ``SentenceTransformerEmbeddings`` classes wrap ``LocalSentenceTransformer``:
one loading rule and one normalisation default (unit-length vectors, so that L2 and cosine
rank alike in any vector store).
"""

from __future__ import annotations

from pathlib import Path

NORMALIZE = True
"""Default of ``normalize`` in both frameworks' embedders."""


def load_local_sentence_transformer(model_dir: str | Path, device: str | None = "cpu"):
    """``SentenceTransformer`` from local files only; a path that is not a directory (a hub id
    would be fetched from the network) raises FileNotFoundError."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError("the local embedder needs sentence-transformers: "
                          "pip install blendrag[chroma]") from exc

    from blendrag.model.loader import quiet_loading

    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no sentence-transformers model directory at {path}")
    with quiet_loading():
        return SentenceTransformer(str(path), device=device, local_files_only=True)


class LocalSentenceTransformer:
    """A local sentence-transformers model: ``encode(texts)`` -> one vector (a list) per text,
    unit length when ``normalize``."""

    def __init__(self, model_path: str | Path, device: str | None = "cpu",
                 normalize: bool = NORMALIZE) -> None:
        self.model = load_local_sentence_transformer(model_path, device)
        self.normalize = normalize

    def encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = self.model.encode(list(texts), normalize_embeddings=self.normalize,
                                    convert_to_numpy=True)
        return vectors.tolist()
