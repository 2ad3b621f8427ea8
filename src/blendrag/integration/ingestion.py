"""Ingestion through a framework hook (LangChain's ``BlendChroma``, LlamaIndex's
``BlendKVTransform``): record the chunk texts for flat-prompt matching, then ingest them and
the separators that sit between them in a prompt, through the one ingestion path
(``blendrag.ingest.Ingestion``).

At ingestion the query prompts are not known yet, so chunk KVs are computed after the engine's
canonical ``chunk_prefix`` (docs/architecture.md, "Chunk prefix").
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from collections.abc import Sequence

from tqdm.auto import tqdm

from blendrag.engine import BlendEngine
from blendrag.ingest import IngestCounts, Ingestion
from blendrag.integration.chunks import ChunkFormat
from blendrag.integration.text_index import ChunkTextIndex
from blendrag.kv.keys import hash_ids

TEXT_INDEX_DIR = "text_index"
"""Folder, inside a store's disk tier, of the chunk texts recorded by the framework hooks."""

PROGRESS_MIN = 32
"""Batches of at least this many chunks get a progress bar unless told otherwise."""


def require_chunk_prefix(engine: BlendEngine) -> None:
    """ValueError unless ``engine`` has a canonical ``chunk_prefix`` (framework hooks ingest
    chunks before any prompt exists)."""
    if engine.prompts is None or engine.prompts.chunk_prefix is None:
        raise ValueError("chunk KVs precomputed before any prompt exists need a canonical prefix: "
                         "build the "
                         "engine with chunk_prefix (e.g. BlendEngine(..., chunk_prefix=''))")


def record(index: ChunkTextIndex, texts: Sequence[str]) -> None:
    """Record chunk texts in ``index`` (those it lacks), for flat prompts to be cut at them."""
    for text in texts:
        if text not in index:
            index.add(text)


def ingest_chunks(engine: BlendEngine, chunks: Sequence[str], *, profile: bool | int = False,
                  separators: Sequence[str] = (), progress: bool | None = None,
                  progress_min: int = PROGRESS_MIN) -> IngestCounts:
    """Ingest formatted chunk texts (in document order: each is a profile neighbour of the next;
    the first one's is the last), then the ``separators`` behind the last chunks (a separator
    sits after a chunk in a prompt). Returns the counts of the chunks (separators not counted).
    ``progress``: a tqdm bar (None: for at least ``progress_min`` chunks with tokens)."""
    require_chunk_prefix(engine)
    run = Ingestion(engine, profile=profile)
    ids = [engine.prompts.encode(c) for c in chunks]
    todo = sum(1 for i in ids if i)  # a text without tokens has no KV
    if not todo:
        return IngestCounts(chunks=len(ids), empty=len(ids))
    show = todo >= progress_min if progress is None else progress
    with tqdm(total=todo, desc="precomputing chunk KVs", unit="chunk", disable=not show) as bar:
        run.on_chunk = lambda i, computed: bar.update(1)
        run.ingest_ids(ids)
    counts = IngestCounts(**run.counts.to_dict())
    run.on_chunk = None
    seps = [s for s in separators if s]
    if seps:
        run.ingest(seps)
    return counts


def kv_identity(engine: BlendEngine, chunk_format: ChunkFormat) -> str:
    """Hash of what a chunk's KV depends on besides its text (model, tokenizer, chunk prefix, chunk
    format): the cache identity of an ingestion step."""
    require_chunk_prefix(engine)
    parts = (engine.model_fp, engine.tokenizer_fp, hash_ids(engine.prompts.chunk_prefix_ids()),
             chunk_format.template, chunk_format.separator)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def default_text_index(engine: BlendEngine) -> ChunkTextIndex:
    """The text index a framework LLM uses unless given one: persisted with the KV store when
    it has a disk tier (``<disk_dir>/text_index``: a new process that opens the store finds
    the chunk texts too), else in memory."""
    folder = engine.store.disk_dir
    return ChunkTextIndex(folder / TEXT_INDEX_DIR) if folder is not None else ChunkTextIndex()


_VOLATILE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def persistence_identity(engine: BlendEngine, index: ChunkTextIndex) -> str:
    """Where the KVs and texts of an ingestion step end up: the same string in a new process
    only when both survive it (a disk or Redis KV tier, a persisted text index); otherwise
    unique to these objects. Part of the LlamaIndex transform's cache key, so that an
    ``IngestionCache`` skips the transform only when skipping loses nothing."""
    kv = engine.store.location()
    texts = str(index.path.resolve()) if index.path is not None else None
    if kv is None:
        kv = f"volatile-{_volatile_id(engine.store)}"
    if texts is None:
        texts = f"volatile-{_volatile_id(index)}"
    return f"kv: {kv}; texts: {texts}"


def _volatile_id(obj: object) -> str:
    if obj not in _VOLATILE:
        _VOLATILE[obj] = uuid.uuid4().hex
    return _VOLATILE[obj]
