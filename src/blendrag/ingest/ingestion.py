"""The one ingestion path: chunk texts -> token ids -> ``engine.precompute``.

Texts are *ingested*: tokenized with the engine's ``PromptBuilder`` exactly as prompts tokenize
them, then their token ids are *precomputed*: ``BlendEngine.precompute`` stores each chunk's KV
computed after the chunk prefix. Every entry point goes through ``Ingestion``:
``BlendEngine.ingest``, the bulk job (``ingest_source``, ``blendrag precompute``), LangChain's
``BlendChroma`` and LlamaIndex's ``BlendKVTransform`` / ``BlendLLM.ingest`` (the last two through
``blendrag.integration``).

An ``Ingestion`` may take its texts in several batches (``add``): with profiles
(``profile=k``, ``engine/profile.py``) the last k non-empty chunks of the earlier batches go in
front of the next batch, stored already and therefore skipped, as the profile neighbours of its
first chunks; so batch boundaries lose no neighbour. A text without any token has no KV: it is
counted as empty and left out.

This package sits below the engine: it uses an engine through ``IngestEngine`` and never imports
``blendrag.engine``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

from blendrag.config import profile_depth

if TYPE_CHECKING:
    import torch

    from blendrag.prompt import PromptBuilder

OnChunk = Callable[[int, bool], None]
"""``on_chunk(i, computed)``: called after text ``i`` of an ``add`` call (not for empty texts)."""


class IngestEngine(Protocol):
    """What ingestion uses of a ``BlendEngine``."""

    prompts: PromptBuilder | None
    adapter: Any  # num_layers, num_kv_heads, head_dim
    dtype: torch.dtype

    def precompute(self, chunk_prefix_ids: Sequence[int], chunks: Sequence[Sequence[int]], *,
                   profile: bool | int = False, on_chunk: OnChunk | None = None) -> list[bool]: ...


@dataclass
class IngestCounts:
    """What an ingestion did so far.

    chunks:   texts given
    computed: KVs computed and stored now
    skipped:  texts whose KV was already stored (or that repeat an earlier text)
    empty:    texts with no tokens (nothing to store)
    tokens:   tokens whose KV was computed
    profiled: computed chunks stored with a context-sensitivity profile
    """

    chunks: int = 0
    computed: int = 0
    skipped: int = 0
    empty: int = 0
    tokens: int = 0
    profiled: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def __iadd__(self, other: IngestCounts) -> IngestCounts:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)
        return self


class Ingestion:
    """One ingestion run on ``engine``: chunk KVs computed after the engine's ``chunk_prefix``,
    else after ``prefix`` (the prompt prefix queries will use); ValueError when there is neither.

    ``profile``: also measure each new chunk's context-sensitivity profile, after the chunk
    before it (``profile=k``: after each of the k before it), across ``add`` calls; the first
    chunk of the run is measured after the last ones of its batch (not at all when that batch
    holds only it; the engine then measures it on first use).
    ``on_chunk(i, computed)``: progress, after each non-empty text ``i`` of an ``add`` call.
    """

    def __init__(self, engine: IngestEngine, prefix: str | None = None, *,
                 profile: bool | int = False,
                 on_chunk: OnChunk | None = None) -> None:
        if engine.prompts is None:
            raise ValueError("ingestion needs an engine with a tokenizer")
        self.engine = engine
        self.depth = profile_depth(profile)
        # raises early without a prefix
        self.chunk_prefix_ids = engine.prompts.chunk_prefix_ids(prefix)
        self.on_chunk = on_chunk
        self.counts = IngestCounts()
        # the last non-empty chunks so far: the next ones' neighbours
        self._previous: list[list[int]] = []

    def add(self, texts: Sequence[str]) -> list[bool | None]:
        """Ingest one batch of texts; per text: True (KV computed now), False (already stored)
        or None (no tokens)."""
        return self.add_ids([self.engine.prompts.encode(t) for t in texts])

    def add_ids(self, chunks: Sequence[Sequence[int]]) -> list[bool | None]:
        """``add`` for texts tokenized already."""
        todo = [i for i, ids in enumerate(chunks) if len(ids)]
        counts = self.counts
        counts.chunks += len(chunks)
        counts.empty += len(chunks) - len(todo)
        # The previous batches' last chunks go first: stored already, they are skipped and not
        # counted again; they are the neighbours of this batch's first chunks.
        head = self._previous[-self.depth:] if self.depth else []
        batch = [*head, *(list(chunks[i]) for i in todo)]
        # precompute profiles no chunk of a list of one
        profiled = self.depth > 0 and len(batch) > 1
        result: list[bool | None] = [None] * len(chunks)

        def done(k: int, computed: bool) -> None:
            if k < len(head):
                return
            i = todo[k - len(head)]
            result[i] = computed
            counts.computed += computed
            counts.skipped += not computed
            counts.tokens += len(chunks[i]) if computed else 0
            counts.profiled += computed and profiled
            if self.on_chunk is not None:
                self.on_chunk(i, computed)

        if todo:
            self.engine.precompute(self.chunk_prefix_ids, batch, profile=self.depth, on_chunk=done)
        self._previous = batch[-self.depth:] if self.depth else []
        return result


def kv_bytes_per_token(engine: IngestEngine) -> int:
    """2 (K, V) x layers x kv_heads x head_dim x bytes per element."""
    a = engine.adapter
    return 2 * a.num_layers * a.num_kv_heads * a.head_dim * engine.dtype.itemsize
