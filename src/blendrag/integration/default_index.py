"""Which text index a framework LLM records and finds chunk texts in when the application
gives none: one per engine and namespace, persisted with the KV store when it has a disk tier
(a new process that opens the store finds the texts too), else in memory, shared by every LLM
made over the engine (chunks ingested through one LLM are found by another)."""

from __future__ import annotations

import logging
import threading
import weakref
from pathlib import Path

from blendrag.engine import BlendEngine
from blendrag.integration.ingestion_key import TEXT_INDEX_DIR
from blendrag.integration.text_index import ChunkTextIndex, index_for_store
from blendrag.store.config import StoreConfig

# engine (its views, shared by every namespace view of it) -> namespace id -> in-memory index
_IN_MEMORY: weakref.WeakKeyDictionary[object, dict[str, ChunkTextIndex]] = (
    weakref.WeakKeyDictionary())
_LOCK = threading.Lock()
log = logging.getLogger(__name__)


def default_text_index(engine: BlendEngine) -> ChunkTextIndex:
    """The text index of ``engine``'s namespace: ``<disk_dir>/text_index`` (``text_index.<ns_id>``
    for a namespace other than the default) with a disk tier, else the engine's in memory."""
    folder = engine.store.disk_dir
    ns_id = engine.store.namespace_id
    if folder is None:
        return _in_memory(engine, ns_id)
    return _persisted(folder / (f"{TEXT_INDEX_DIR}.{ns_id}" if ns_id else TEXT_INDEX_DIR),
                      engine, ns_id)


def index_folder(config: StoreConfig) -> Path | None:
    """The folder of the text index kept with the store ``config`` describes:
    ``<disk_dir>/text_index`` (``text_index.<ns_id>`` in a namespace other than the default);
    None without a disk tier. What a job writing into the store records its texts in."""
    if config.disk_dir is None:
        return None
    ns_id = config.names.ns_id
    return Path(config.disk_dir) / (f"{TEXT_INDEX_DIR}.{ns_id}" if ns_id else TEXT_INDEX_DIR)


def namespaced_index(index: ChunkTextIndex, engine: BlendEngine,
                     namespace: str) -> ChunkTextIndex:
    """The text index ``namespace`` records its chunk texts in, beside ``index`` (one the
    application gave for ``engine``'s namespace): a folder of its own next to a persisted one
    (named by the namespace id, never the tenant's name), else the namespace's in memory."""
    ns_id = engine.store.namespaced(namespace).namespace_id
    if index.path is None:
        return _in_memory(engine, ns_id)
    return _persisted(index.path.with_name(f"{index.path.name}.{ns_id}"), engine, ns_id)


def _in_memory(engine: BlendEngine, ns_id: str) -> ChunkTextIndex:
    """The in-memory index of ``engine``'s namespace ``ns_id``, made at its first use; it lives
    as long as the engine."""
    with _LOCK:
        return _IN_MEMORY.setdefault(engine.views, {}).setdefault(ns_id, ChunkTextIndex())


def _persisted(folder: Path, engine: BlendEngine, ns_id: str) -> ChunkTextIndex:
    """A text index in ``folder`` under the store's keys (rows signed, texts encrypted when the
    store encrypts), bound to the namespace id ``ns_id``; the namespace's in memory, with a
    warning, when the folder holds one that cannot be used (its bytes are untrusted: a request
    never fails on them)."""
    config = getattr(engine.store, "config", None)  # a TieredKVStore's StoreConfig
    try:
        if not isinstance(config, StoreConfig):  # a store with no keys to sign with (RAM)
            return ChunkTextIndex(folder, namespace=ns_id)
        return index_for_store(folder, config, ns_id)
    except ValueError as exc:
        log.warning("%s; chunk texts of this namespace are recorded in memory only, for this "
                    "process", exc)
        return _in_memory(engine, ns_id)
