"""Ingestion: chunk texts are tokenized as prompts tokenize them and their KVs precomputed.

``Ingestion`` (``ingestion.py``) is the one path every entry point takes: ``BlendEngine.ingest``,
the bulk job, ``blendrag precompute``, ``BlendChroma`` and the LlamaIndex transform. The job
(``job.py``) reads a source (``sources.py``: a Chroma collection, a folder, a JSONL file) in
batches, resumably:

>>> from blendrag.ingest import chunks_from_chroma, ingest_source
>>> summary = ingest_source(engine, chunks_from_chroma("./chroma", "docs"))
>>> print(summary.format())

A corpus too large for one process is precomputed by many: each worker builds its engine from
picklable ``IngestSettings`` (``settings.py``) and runs ``ingest_shard`` (``shard.py``: Dask,
Spark) or is a Ray actor (``blendrag.ingest.ray``, ``pip install blendrag[ray]``).

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
from blendrag.ingest.settings import IngestSettings
from blendrag.ingest.shard import combine, ingest_shard
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
    "IngestSettings",
    "IngestSummary",
    "Ingestion",
    "chunks_from_chroma",
    "chunks_from_folder",
    "chunks_from_jsonl",
    "combine",
    "ingest_shard",
    "ingest_source",
    "kv_bytes_per_token",
]
