"""Ingestion: chunk texts are tokenized as prompts tokenize them and their KVs precomputed.

``Ingestion`` (``ingestion.py``) is the one path every entry point takes: ``BlendEngine.ingest``,
the bulk job, ``blendrag precompute``, ``BlendChroma`` and the LlamaIndex transform. The job
(``job.py``) reads a source (``sources.py``: a Chroma collection, a folder, a JSONL file) in
batches, resumably:

>>> from blendrag.ingest import chunks_from_chroma, ingest_source
>>> summary = ingest_source(engine, chunks_from_chroma("./chroma", "docs"))
>>> print(summary.format())

A corpus too large for one process: ``blendrag.distributed`` runs the same path in many
workers (Ray actors, Dask or Spark tasks, LlamaIndex's worker processes).

See docs/store.md ("Precompute"), docs/scale.md and ``blendrag precompute --help``.
"""

from blendrag.ingest.ingestion import (
    ChunkFailure,
    IngestCounts,
    IngestEngine,
    Ingestion,
    kv_bytes_per_token,
)
from blendrag.ingest.job import IngestSummary, ingest_source
from blendrag.ingest.sources import (
    ChunkSource,
    chunks_from_chroma,
    chunks_from_folder,
    chunks_from_jsonl,
)

__all__ = [
    "ChunkFailure",
    "ChunkSource",
    "IngestCounts",
    "IngestEngine",
    "IngestSummary",
    "Ingestion",
    "chunks_from_chroma",
    "chunks_from_folder",
    "chunks_from_jsonl",
    "ingest_source",
    "kv_bytes_per_token",
]
