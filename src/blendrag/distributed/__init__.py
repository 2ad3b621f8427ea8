"""Precompute a corpus in many workers: Ray actors, Dask or Spark tasks, LlamaIndex's worker
processes.

A worker gets plain, picklable ``IngestSettings`` (``settings.py``), builds its engine from
them once and runs the one ingestion path on the chunks it is given, writing into the shared
tier itself (``shard.py``: ``ingest_shard`` for Dask's ``client.map`` and Spark's
``mapPartitions``). ``blendrag.distributed.ray`` runs it on a Ray cluster (``pip install
blendrag[ray]``; imported on its own, so this package needs no ray).

This package sits above the engine (it builds engines) and below the framework integrations
and the command line. See docs/scale.md.
"""

from blendrag.distributed.settings import IngestSettings, shared_engine
from blendrag.distributed.shard import combine, ingest_rows, ingest_shard, summarize

__all__ = ["IngestSettings", "combine", "ingest_rows", "ingest_shard", "shared_engine",
           "summarize"]
