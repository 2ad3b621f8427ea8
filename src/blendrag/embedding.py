"""Loading a sentence-transformers embedder from a local directory (never from a hub).

Both framework embedding classes (LangChain's and LlamaIndex's) go through this one rule.
"""

from __future__ import annotations

from pathlib import Path


def load_local_sentence_transformer(model_dir: str | Path, device: str | None = "cpu"):
    """``SentenceTransformer`` from local files only; a path that is not a directory (a hub id
    would be fetched from the network) raises FileNotFoundError."""
    from sentence_transformers import SentenceTransformer

    from blendrag.model.loader import quiet_loading

    path = Path(model_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no sentence-transformers model directory at {path}")
    with quiet_loading():
        return SentenceTransformer(str(path), device=device, local_files_only=True)
