"""Bulk KV precompute: read chunk texts from a source, compute and store each chunk's KV once.

>>> from blendrag.ingest import chunks_from_chroma, precompute
>>> summary = precompute(engine, chunks_from_chroma("./chroma", "docs"))
>>> print(summary.format())

See docs/store.md ("Precompute") and ``blendrag precompute --help``.
"""

from blendrag.ingest.job import PrecomputeSummary, kv_bytes_per_token, precompute
from blendrag.ingest.sources import ChunkSource, chunks_from_chroma, chunks_from_folder, chunks_from_jsonl

__all__ = [
    "ChunkSource",
    "PrecomputeSummary",
    "chunks_from_chroma",
    "chunks_from_folder",
    "chunks_from_jsonl",
    "kv_bytes_per_token",
    "precompute",
]
