"""What a worker process needs to precompute chunks on its own: plain, picklable settings.

A distributed job (Ray actors, Dask or Spark tasks, LlamaIndex's worker processes) cannot ship
an engine to its workers: a model, a store's open files and sockets do not pickle, and a model
shipped per task would cost more than the work. Each worker gets ``IngestSettings`` instead and
builds its engine once (``shared_engine``): the model loaded in the worker, the store opened
there, writing straight into the shared tier (Redis, or a folder every worker can reach).

This module imports no torch: the engine is built on first use.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blendrag.spec import EngineSpec
from blendrag.store.config import StoreConfig

if TYPE_CHECKING:
    from blendrag.engine.engine import BlendEngine
    from blendrag.integration.text_index import ChunkTextIndex


@dataclass(frozen=True)
class IngestSettings(EngineSpec):
    """How a worker builds its engine (every ``EngineSpec`` field) and where it stores what it
    computes.

    chunk_prefix: the engine's canonical chunk prefix (default ``""``, the framework
                  integrations')
    prefix:       instead of ``chunk_prefix``: the prompt prefix queries will use
    store:        the KV store each worker opens; it must outlive the worker: a shared tier
                  (Redis, S3) or a folder every worker writes to (a multi-node job needs a
                  shared tier)
    text_index:   also record the texts in this ``ChunkTextIndex`` folder (None: not recorded)
    batch_size:   texts looked up in the store and computed at once
    """

    chunk_prefix: str | None = ""
    store: StoreConfig = field(default_factory=lambda: StoreConfig(ram_bytes=0))
    prefix: str | None = None
    text_index: str | Path | None = None
    batch_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.prefix is not None and self.chunk_prefix is not None:
            raise ValueError("IngestSettings takes chunk_prefix or prefix, not both: with the "
                             "prompt prefix, set chunk_prefix=None")
        if self.prefix is None and self.chunk_prefix is None:
            raise ValueError("IngestSettings needs chunk_prefix (the engine's canonical one, "
                             "e.g. '') or prefix (the prompt prefix queries will use)")
        self._check_store()
        if self.context is not None:
            self._check_context()
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) \
                or self.batch_size < 1:
            raise ValueError(f"IngestSettings.batch_size must be >= 1, got {self.batch_size!r}")

    def _check_store(self) -> None:
        if self.store is None:
            raise ValueError("IngestSettings.store must be a StoreConfig the workers write to, "
                             "got None")
        if not shared_tiers(self.store) and self.store.disk_dir is None:
            # a RAM tier dies with the worker: the job would compute everything for nothing
            raise ValueError("IngestSettings.store must outlive the workers: give it a shared "
                             "tier (redis_url, s3_url) or a folder every worker writes to "
                             "(disk_dir)")

    def _check_context(self) -> None:
        from blendrag.engine.caches.context import ChunkContext

        if not isinstance(self.context, ChunkContext):
            raise ValueError(f"IngestSettings.context must be a ChunkContext or None, got "
                             f"{type(self.context).__name__}")

    @classmethod
    def of(cls, spec: EngineSpec, **job: Any) -> IngestSettings:
        """``spec``'s engine with this job's settings (``prefix``, ``text_index``,
        ``batch_size``; a ``store`` or ``chunk_prefix`` given here wins)."""
        return cls(**{**spec.field_values(), **job})

    def with_store(self, store: StoreConfig) -> IngestSettings:
        """The same settings writing into ``store``."""
        return replace(self, store=store)

    def build_engine(self) -> BlendEngine:
        """A new engine: the model loaded here, the store opened here (``EngineSpec.build``)."""
        return self.build()

    def build_text_index(self) -> ChunkTextIndex | None:
        """The text index the texts are recorded in, or None."""
        if self.text_index is None:
            return None
        from blendrag.integration.text_index import index_for_store

        return index_for_store(self.text_index, self.store)


def shared_tiers(store: StoreConfig) -> list[str]:
    """The store's tiers that workers on different machines share: Redis, S3."""
    return [name for name, on in (("redis", store.redis_url), ("s3", store.s3_url)) if on]


_LOCK = threading.Lock()
_SHARED: dict[str, tuple[BlendEngine, ChunkTextIndex | None]] = {}


def shared_engine(settings: IngestSettings) -> tuple[BlendEngine, ChunkTextIndex | None]:
    """This process's engine (and text index) for ``settings``, built on first use: a worker
    running many shards or batches loads the model once. One set of settings is kept; other
    settings replace it (the engine replaced is left to whoever still holds it, open)."""
    key = repr(replace(settings, batch_size=1))
    with _LOCK:
        if key not in _SHARED:
            _SHARED.clear()
            _SHARED[key] = (settings.build_engine(), settings.build_text_index())
        return _SHARED[key]
