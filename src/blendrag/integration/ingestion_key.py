"""What an ingestion's KVs depend on besides the chunk texts, and where they and the recorded
texts end up: the two halves of LlamaIndex's ingestion-cache key for ``BlendKVTransform``.

One recipe for both ways a transform is built: on a running engine (the model known by its
weights and tokenizer) and on an ``EngineSpec`` that worker processes build from (the model
known by name: the driver loads none). A key must change whenever skipping the transform would
lose something: another model, chunk prefix, ingestion context or chunk format (the KVs
differ), or another store location or text index (the KVs or texts are elsewhere). A location
that does not outlive the process (a RAM tier, an in-memory index) is unique to its object, so
that a new process never skips the work.
"""

from __future__ import annotations

import hashlib
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from blendrag.integration.chunks import ChunkFormat
from blendrag.kv.keys import hash_ids

if TYPE_CHECKING:
    from blendrag.engine import BlendEngine
    from blendrag.integration.text_index import ChunkTextIndex
    from blendrag.prompt import PromptBuilder
    from blendrag.spec import EngineSpec

TEXT_INDEX_DIR = "text_index"
"""Folder, inside a store's disk tier, of the chunk texts recorded by the framework hooks."""


@dataclass(frozen=True)
class KVIdentity:
    """What a chunk's stored KV depends on besides its text."""

    model: str
    tokenizer: str
    chunk_prefix: str
    context: str

    @classmethod
    def of_engine(cls, engine: BlendEngine) -> KVIdentity:
        """The running engine's: its weights, tokenizer, chunk prefix ids and context."""
        if engine.prompts is None:
            raise ValueError("the engine has no tokenizer: chunk texts cannot be keyed")
        require_chunk_prefix(engine.prompts)
        return cls(engine.model_fp, engine.tokenizer_fp,
                   hash_ids(engine.prompts.chunk_prefix_ids()), repr(engine.context))

    @classmethod
    def of_spec(cls, spec: EngineSpec) -> KVIdentity:
        """A spec's, by name: the model as named (file, dtype), its prompt settings."""
        return cls(f"{spec.model}|{spec.gguf_file}|{spec.dtype}", "as the model names it",
                   f"{spec.chat}|{spec.system}|{spec.chunk_prefix}", repr(spec.context))

    def key(self, chunk_format: ChunkFormat) -> str:
        """The hash of this identity and the chunk format the texts are written in."""
        parts = (self.model, self.tokenizer, self.chunk_prefix, self.context,
                 chunk_format.template, chunk_format.separator)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def require_chunk_prefix(prompts: PromptBuilder) -> None:
    """ValueError unless the engine has a canonical ``chunk_prefix`` (framework hooks ingest
    chunks before any prompt exists)."""
    if prompts.chunk_prefix is None:
        raise ValueError("chunk KVs precomputed before any prompt exists need a canonical "
                         "prefix: build the engine with chunk_prefix (e.g. "
                         "BlendEngine(..., chunk_prefix=''))")


def engine_persistence(engine: BlendEngine, text_index: ChunkTextIndex) -> str:
    """Where a running engine's ingestion ends up: its store, its text index."""
    store = engine.store
    texts = str(text_index.path.resolve()) if text_index.path is not None else None
    return _persistence(store.location() or _volatile(store), texts or _volatile(text_index))


def spec_persistence(spec: EngineSpec, text_index: str | Path | None) -> str:
    """Where the ingestion of workers built from ``spec`` ends up: the store's tiers (every
    persistent one, S3 included), the text index folder (``text_index``, else the one kept in
    the disk tier, as ``BlendLLM`` looks for it)."""
    store = spec.store
    if text_index is None and store is not None and store.disk_dir is not None:
        text_index = Path(store.disk_dir) / TEXT_INDEX_DIR
    kv = store.location() if store is not None else None
    texts = str(Path(text_index).resolve()) if text_index is not None else None
    return _persistence(kv or f"volatile-{uuid.uuid4().hex}",
                        texts or f"volatile-{uuid.uuid4().hex}")


def _persistence(kv: str, texts: str) -> str:
    return f"kv: {kv}; texts: {texts}"


_VOLATILE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _volatile(obj: object) -> str:
    """A name unique to ``obj`` for as long as it lives."""
    if obj not in _VOLATILE:
        _VOLATILE[obj] = uuid.uuid4().hex
    return f"volatile-{_VOLATILE[obj]}"
