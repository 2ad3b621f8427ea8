"""A persisted Chroma collection for the chunk-source, ingestion-job and CLI tests."""

from __future__ import annotations

import pytest

DOCS = [f"Passage {i}: the river Oslo crosses Paris in {1900 + i}." for i in range(5)]


def make_chroma(path, docs, name="docs") -> None:
    """A persisted collection filled with explicit embeddings (no embedding model involved)."""
    chromadb = pytest.importorskip("chromadb")
    client = chromadb.PersistentClient(path=str(path))
    col = client.create_collection(name, embedding_function=None)
    col.add(ids=[f"id{i:03d}" for i in range(len(docs))], documents=list(docs),
            embeddings=[[float(i), 1.0, 0.5] for i in range(len(docs))])
