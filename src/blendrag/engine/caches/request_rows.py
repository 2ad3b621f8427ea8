"""A request's cached rows (``RequestRows``), as ``ChunkCache.rows_for`` fills them: the prefix's
rows, then each chunk's, a stored entry opened for layer-wise reads or, on a miss, the chunk
computed and stored now (a key that failed to load in an earlier attempt: computed once, kept);
a chunk stored without the profile its selector reads is profiled now, once."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from blendrag.config import BlendConfig
from blendrag.engine.caches.context import NO_CONTEXT, ChunkContext
from blendrag.engine.caches.device_tier import TIER as DEVICE
from blendrag.engine.caches.history import HISTORY_TAG, HistoryRows
from blendrag.engine.caches.profile import neighbours, profiled
from blendrag.engine.compute.fused_kv import CachedSegment
from blendrag.engine.compute.runner import ModelRunner
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayeredEntry, LayerReadError, MemoryLayeredEntry
from blendrag.store.protocol import KVStore

Ids = Sequence[int]


class ChunkLookup(Protocol):
    """What filling a request's rows asks of the chunk cache (engine/caches/chunk_cache.py)."""

    runner: ModelRunner
    store: KVStore
    context: ChunkContext

    def key(self, chunk_prefix_ids: Ids, chunk_ids: Ids,
            context: ChunkContext | None = None) -> str: ...

    def context_for(self, chunk_prefix_ids: Ids, chunk_ids: Ids) -> ChunkContext: ...

    def open(self, chunk_prefix_ids: Ids, chunk_ids: Ids, context: ChunkContext,
             skip: Collection[str] = frozenset(),
             opened: list[LayeredEntry] | None = None) -> LayeredEntry | None: ...

    def prefix(self, prefix_ids: Ids) -> ChunkKV | None: ...

    def replace(self, key: str, kv: ChunkKV) -> None: ...

    def compute_and_put(self, chunk_prefix: ChunkKV | None, chunk_prefix_ids: Ids,
                        chunk_ids: Ids, context: ChunkContext, ram: bool = True,
                        exact: bool = False) -> ChunkKV: ...


@dataclass
class RequestRows:
    """The cached rows of one request (``ChunkCache.rows_for``): ``segments`` in prompt order
    (stored entries opened for layer-wise reads, chunks computed now) and what the lookups
    found. A context manager: leaving it closes the opened entries, which promotes an entry
    read through to faster tiers."""

    segments: list[CachedSegment] = field(default_factory=list)
    opened: list[LayeredEntry] = field(default_factory=list)
    chunk_hits: int = 0
    chunk_misses: int = 0
    device_hits: int = 0  # entries (chunks and the prefix) served by the device tier
    hit_chunks: list[int] = field(default_factory=list)  # indices of the chunks found stored
    prefix_hit: bool = False
    exact_first: bool = False  # the first passage's rows are its exact ones (ChunkContext)
    profiles_computed: int = 0
    chunks_without_context: int = 0  # too long for the ingestion context (``context_for``)
    # keeps an entry read through in the device tier (``ChunkCache.keep_on_device``)
    promote: Callable[[LayeredEntry], None] | None = None

    def close(self) -> None:
        for entry in self.opened:
            if self.promote is not None:
                self.promote(entry)
            entry.close()

    def failing_at(self, layer: int, known: str) -> list[str]:
        """The keys of the other opened entries whose ``layer`` fails to load too (besides
        ``known``'s): found at once, so that one retry computes them all."""
        bad = []
        for seg in self.segments:
            if seg.kv.complete or seg.kv.key == known:  # every layer in memory: cannot fail
                continue
            try:
                seg.kv.layer(layer)
            except LayerReadError as exc:
                bad.append(exc.key)
        return bad

    def __enter__(self) -> RequestRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request_chunks(cache: ChunkLookup, layout: PromptLayout, config: BlendConfig,
                   head: int = 0) -> Iterator[tuple[int, tuple[int, int], Ids, Ids,
                                                    ChunkContext, bool]]:
    """Per chunk after row ``head``: (its index, its span, the ids it is computed after,
    its ids, the context it is stored in, whether its rows are exact)."""
    chunk_prefix_ids = _computed_after(layout, config)
    chunks = layout.chunk_ids[:1] if config.mode == "prefix" else layout.chunk_ids
    # the first passage follows this very prefix: its rows computed alone are exact
    exact_first = chunk_prefix_ids == layout.prefix_ids and cache.context.stores_alone
    for i, (span, ids) in enumerate(zip(layout.chunk_spans, chunks)):
        if span[1] <= head:
            continue
        exact = exact_first and i == 0 or config.mode == "prefix"
        context = NO_CONTEXT if exact else cache.context_for(chunk_prefix_ids, ids)
        yield i, span, chunk_prefix_ids, ids, context, exact


def fill(cache: ChunkLookup, rows: RequestRows, layout: PromptLayout, config: BlendConfig,
         failed: dict[str, ChunkKV | None], head: int, history: HistoryRows | None) -> None:
    """Fill ``rows`` with the request's cached rows (``ChunkCache.rows_for``): its prefix's,
    then each chunk's after row ``head`` (stored, computed now, or the history's)."""
    prefix: LayeredEntry | None = None  # exact whatever follows it
    if layout.prefix_ids and not head:
        prefix, rows.prefix_hit = _open_or_compute(
            cache, rows, failed, (), layout.prefix_ids, NO_CONTEXT, lambda: None, exact=True)
        rows.segments.append(CachedSegment(0, prefix))
    whole: list[ChunkKV | None] = []  # the chunk prefix's KV, once a missing chunk needs it
    after = _computed_after(layout, config)

    def chunk_prefix() -> ChunkKV | None:
        if not whole:
            same = after == layout.prefix_ids
            whole.append(_whole(prefix) if same and prefix is not None
                         else cache.prefix(after))
        return whole[0]

    profile = config.mode == "blend" and config.selector == "profile"
    chunks = layout.chunk_ids[:1] if config.mode == "prefix" else layout.chunk_ids
    for i, (start, _), chunk_prefix_ids, ids, context, exact in request_chunks(
            cache, layout, config, head):
        if history is not None and start == history.start:
            rows.segments.append(CachedSegment(start, MemoryLayeredEntry(history.kv,
                                                                         tier=HISTORY_TAG)))
            continue
        rows.chunks_without_context += context is NO_CONTEXT and not exact
        # prefix mode's chunk: rows it counts as exact, so stored exactly and never rounded
        entry, hit = _open_or_compute(cache, rows, failed, chunk_prefix_ids, ids, context,
                                      chunk_prefix, exact=config.mode == "prefix")
        rows.chunk_hits += hit
        if hit:
            rows.hit_chunks.append(i)
        rows.chunk_misses += not hit
        rows.exact_first |= exact and config.mode != "prefix"
        if profile and entry.profile is None and not exact:  # exact rows need no profile
            kv = entry.materialize()
            _close_early(rows, entry)  # promoted now: never over the profiled rows stored next
            kv = _profile_now(cache, kv, chunk_prefix_ids, chunk_prefix(), chunks, i, rows)
            entry = MemoryLayeredEntry(kv, tier="computed")
        rows.segments.append(CachedSegment(start, entry))


def _open_or_compute(cache: ChunkLookup, rows: RequestRows, failed: dict[str, ChunkKV | None],
                     chunk_prefix_ids: Ids, ids: Ids, context: ChunkContext,
                     chunk_prefix: Callable[[], ChunkKV | None],
                     exact: bool = False) -> tuple[LayeredEntry, bool]:
    """(the stored entry, True) or (the KV computed and stored now, False); a key that
    failed in an earlier attempt is computed once and its KV kept in ``failed``. ``exact``:
    rows the request counts as a full prefill's (a prefix, prefix mode's chunk): an entry
    stored rounded (``LayeredEntry.exact``) is computed again, and what is computed is stored
    in the model's dtype over it."""
    key = cache.key(chunk_prefix_ids, ids, context)
    kv = failed.get(key)
    if kv is None:
        entry = cache.open(chunk_prefix_ids, ids, context, failed.keys(), rows.opened)
        if entry is not None and (entry.exact or not exact):
            rows.device_hits += entry.tier == DEVICE
            return entry, True
        if entry is not None:  # rounded: closed now (its reads ahead dropped), replaced below
            _close_early(rows, entry)
        kv = cache.compute_and_put(chunk_prefix(), chunk_prefix_ids, ids, context,
                                   exact=exact)
        if key in failed:
            failed[key] = kv
    return MemoryLayeredEntry(kv, tier="computed"), False


def _profile_now(cache: ChunkLookup, kv: ChunkKV, chunk_prefix_ids: Ids,
                 chunk_prefix: ChunkKV | None, chunks: Sequence[Ids], i: int,
                 rows: RequestRows) -> ChunkKV:
    """A chunk stored without a profile, met by the ``profile`` selector: measure it after
    its neighbour in this prompt (the rule of ``precompute``) and store it, once."""
    probes = neighbours(chunks, i)
    if not probes:  # a lone chunk: nothing to blend with, the selector has no use for it
        return kv.with_profile(torch.zeros(kv.num_tokens))
    kv = profiled(cache.runner, kv, chunk_prefix_ids, probes, chunk_prefix)
    cache.replace(cache.key(chunk_prefix_ids, kv.token_ids), kv)
    rows.profiles_computed += 1
    return kv


def _close_early(rows: RequestRows, entry: LayeredEntry) -> None:
    """Close an opened ``entry`` that the request replaces before it ends (its rows, read
    through, promoted to the faster tiers now), so that ``RequestRows.close`` does not promote
    it over what replaced it."""
    if any(e is entry for e in rows.opened):
        rows.opened = [e for e in rows.opened if e is not entry]
        entry.close()


def _computed_after(layout: PromptLayout, config: BlendConfig) -> tuple[int, ...]:
    """The ids a request's chunks are computed after: the chunk prefix, or in prefix mode the
    request's own prefix (only a chunk computed after this very prefix is an exact prefix)."""
    return layout.prefix_ids if config.mode == "prefix" else layout.chunk_prefix_ids


def _whole(kv: ChunkKV | LayeredEntry | None) -> ChunkKV | None:
    """A cached KV in full (an opened entry is read through)."""
    return kv if kv is None or isinstance(kv, ChunkKV) else kv.materialize()
