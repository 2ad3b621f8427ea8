"""One prefill request, from the store to the first-token logits.

``prefill`` runs attempts until one completes: an attempt opens the request's cached entries
for layer-wise reads (computing and storing the chunks the store misses), lets the loading
controller choose the ratio (``ratio="auto"``), plans the layer loop (a selector, the preview
pass) and runs it with a ``LayerFeed`` that reads the cached rows, pipelined or not. A cached
entry whose layer fails to load midway (a tier error, a checksum) is never used: the attempt
is abandoned and the next one computes that chunk instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from blendrag.config import BlendConfig
from blendrag.engine.context import NO_CONTEXT, ChunkContext
from blendrag.engine.controller import decide, observe
from blendrag.engine.fused_kv import CachedSegment, FusedKV
from blendrag.engine.layer_feed import LayerFeed
from blendrag.engine.phases import OFF, PhaseClock
from blendrag.engine.prefill import LoopOutput, LoopPlan, run_loop
from blendrag.engine.preview import suffix_attention
from blendrag.engine.profile import neighbours
from blendrag.engine.selectors import make_selector
from blendrag.engine.stats import RequestStats
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayeredEntry, LayerReadError, open_layers

if TYPE_CHECKING:
    from blendrag.engine.engine import BlendEngine

log = logging.getLogger(__name__)


@dataclass
class Prefill:
    """A finished prefill: first-token logits [vocab] (float32) and the request's KV."""

    logits: torch.Tensor
    fused: FusedKV
    stats: RequestStats
    output: LoopOutput  # the layer loop's result (its trace when asked for)


def prefill(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
            extra_capacity: int, trace: bool, timed: bool, depth: int) -> Prefill:
    """Prefill ``layout`` (already length-checked) with ``depth`` layers read ahead; see the
    module docstring for the retries (``stats.load_retries``)."""
    t0 = time.perf_counter()
    skip: set[str] = set()
    while True:
        try:
            pre = _attempt(engine, layout, config, extra_capacity, trace, timed, depth, skip, t0)
        except LayerReadError as exc:
            if exc.key in skip:  # never opened again: a bug, not a storage failure
                raise
            log.warning("cached rows of entry %s failed to load (%s); computing that chunk "
                        "again", exc.key[:12], exc)
            skip.add(exc.key)
            continue
        pre.stats.load_retries = len(skip)
        return pre


def _attempt(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
             extra_capacity: int, trace: bool, timed: bool, depth: int, skip: set[str],
             t0: float) -> Prefill:
    """One attempt at the request; raises ``LayerReadError`` when a cached layer fails."""
    clock = PhaseClock(engine.device) if timed else OFF
    clock.restart()
    stats = new_stats(layout, config)
    before = engine.store.stats()
    opened: list = []  # entries opened for this attempt, closed whatever happens
    feed = None
    try:
        t_fetch = time.perf_counter()
        cached = cached_segments(engine, layout, config, stats, skip, opened)
        stats.kv_fetch_s = time.perf_counter() - t_fetch
        clock.lap("fetch")
        feed = LayerFeed(cached, engine.adapter.num_layers, engine.device, depth)
        config = _auto_ratio(engine, config, layout, cached, feed, stats)
        n = layout.num_tokens
        stats.tokens_reused = sum(s.kv.num_tokens for s in cached)
        stats.layers = engine.adapter.num_layers
        t1 = time.perf_counter()
        fused = engine._buffer(n + extra_capacity)
        rope = engine.rope(n)
        clock.lap("setup")
        loop = make_plan(engine, layout, config, cached, fused, rope, stats, clock, feed)
        out = run_loop(engine.adapter, loop, fused, rope, trace=trace, clock=clock)
        logits = engine.logits(out.hidden)
        clock.lap("logits")
        _sync(engine.device)
        stats.prefill_s = time.perf_counter() - t1
        stats.ttft_s = time.perf_counter() - t0
    finally:
        if feed is not None:
            feed.close()
        for entry in opened:  # a stored entry read through is promoted to faster tiers
            entry.close()
    # this request's fetches and writes
    stats.store = engine.store.stats().since(before).to_dict()
    stats.phase_s = dict(clock.seconds) if timed else None
    stats.computed_per_layer = out.active_per_layer
    stats.recomputed_chunk_tokens_per_layer = out.chunk_active_per_layer
    stats.attended_keys_per_layer = out.attended_keys_per_layer
    observe(engine.controller, feed, stats, out.load_work_s + stats.preview_load_work_s)
    return Prefill(logits, fused, stats, out)


def _auto_ratio(engine: BlendEngine, config: BlendConfig, layout: PromptLayout,
                cached: list[CachedSegment], feed: LayerFeed,
                stats: RequestStats) -> BlendConfig:
    """``config`` at the controller's ratio when it asks for one (``ratio="auto"``)."""
    if config.mode != "blend" or not config.auto_ratio:
        return config
    ratio, stats.controller = decide(engine.controller, config, cached, feed, stats)
    stats.ratio = ratio
    return config.at_ratio(ratio)


def cached_segments(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
                    stats: RequestStats, skip: frozenset[str] | set[str] = frozenset(),
                    opened: list | None = None) -> list[CachedSegment]:
    """The cached rows of the request: stored entries opened for layer-wise reads (their
    layers are read by the loop's ``LayerFeed``), chunks missing from the store (or in
    ``skip``: failed in an earlier attempt) computed and stored now. ``opened`` collects
    the entries opened, for the caller to close."""
    if config.mode == "full":
        return []
    opened = [] if opened is None else opened

    def open_or_compute(prefix_ids, ids, context, chunk_prefix) -> tuple[object, bool]:
        """(the stored entry, True) or (the KV computed and stored now, False)."""
        kv = _open(engine, prefix_ids, ids, context, skip, opened)
        if kv is not None:
            return kv, True
        return engine._compute(_whole(chunk_prefix()), prefix_ids, ids, context), False

    prefix = None  # exact whatever follows it
    if layout.prefix_ids:
        prefix, stats.prefix_hit = open_or_compute((), layout.prefix_ids, NO_CONTEXT,
                                                   lambda: None)
    segments = [CachedSegment(0, prefix)] if prefix is not None else []
    # only a chunk computed after this very prefix is an exact prefix
    context = engine.context
    if config.mode == "prefix":
        chunk_prefix_ids, chunks = layout.prefix_ids, layout.chunk_ids[:1]
        context = NO_CONTEXT
    else:
        chunk_prefix_ids, chunks = layout.chunk_prefix_ids, layout.chunk_ids
    same = chunk_prefix_ids == layout.prefix_ids

    def chunk_prefix():  # its whole KV, needed only to compute a missing chunk
        return prefix if same else engine.prefix_kv(chunk_prefix_ids)

    profile = config.mode == "blend" and config.selector == "profile"
    # the first passage follows this very prefix: its rows computed alone are exact
    exact_first = same and context.stores_alone
    for i, ((start, _), ids) in enumerate(zip(layout.chunk_spans, chunks)):
        exact = exact_first and i == 0
        kv, hit = open_or_compute(chunk_prefix_ids, ids, NO_CONTEXT if exact else context,
                                  chunk_prefix)
        stats.chunk_hits += hit
        stats.chunk_misses += not hit
        stats.exact_first |= exact
        if profile and kv.sensitivity is None and not exact:  # exact rows need no profile
            kv = _profile_now(engine, _whole(kv), chunk_prefix_ids, _whole(chunk_prefix()),
                                   chunks, i, stats)
        segments.append(CachedSegment(start, kv))
    return segments


def _open(engine: BlendEngine, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
          context: ChunkContext, skip: frozenset[str] | set[str],
          opened: list) -> LayeredEntry | None:
    """The stored entry of the chunk opened for layer-wise reads (header checked against
    the request), or None: a miss, a key in ``skip``, or a foreign entry."""
    key = engine.key(chunk_prefix_ids, chunk_ids, context)
    if key in skip:
        return None
    entry = open_layers(engine.store, key)
    if entry is None:
        return None
    opened.append(entry)
    return entry if engine._matches(entry, entry.shape, entry.dtype, chunk_prefix_ids,
                                  chunk_ids, context) else None


def _profile_now(engine: BlendEngine, kv: ChunkKV, chunk_prefix_ids: Sequence[int],
                 chunk_prefix: ChunkKV | None,
                 chunks: Sequence[Sequence[int]], i: int, stats: RequestStats) -> ChunkKV:
    """A chunk stored without a profile, met by the ``profile`` selector: measure it after its
    neighbour in this prompt (same rule as :meth:`precompute`) and store it, once."""
    probes = neighbours(chunks, i)
    if not probes:  # a lone chunk: nothing to blend with, the selector has no use for it
        return kv.with_sensitivity(torch.zeros(kv.num_tokens))
    kv = engine.profiled(kv, chunk_prefix_ids, probes, chunk_prefix)
    engine.store.put(engine.key(chunk_prefix_ids, kv.token_ids, engine.context), kv)
    stats.profiles_computed += 1
    return kv


def make_plan(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
              cached: list[CachedSegment], fused: FusedKV, rope: RopeTable, stats: RequestStats,
              clock: PhaseClock = OFF, feed: LayerFeed | None = None) -> LoopPlan:
    """The layer loop's plan for ``config``: which rows are cached, which tokens computed (the
    blend selector's choice, after the preview pass for ``preview``)."""
    dev = engine.device
    ids = torch.tensor(layout.ids, device=dev)
    n = layout.num_tokens
    chunks = (len(layout.prefix_ids), layout.suffix_start)
    first_computed = cached[-1].end if cached else 0
    if config.mode != "blend":
        return LoopPlan(ids, cached, torch.arange(first_computed, n, device=dev),
                        chunk_range=chunks, feed=feed)
    chunk_kvs = [s.kv for s in cached if s.start >= chunks[0]]
    attention = None
    if config.selector == "preview":  # where the question looks, over the cached rows
        clock.lap("plan")
        preview = suffix_attention(engine.adapter, layout, cached, fused, rope, feed)
        attention, stats.preview_attended_keys, stats.preview_load_work_s = preview
        stats.preview_tokens = len(layout.suffix_ids)
        clock.lap("preview")
    selector = make_selector(config, layout, engine.adapter.num_layers, dev, engine.adapter.scaling,
                             chunk_kvs, attention)
    clock.lap("plan")
    suffix = torch.arange(layout.suffix_start, n, device=dev)
    return LoopPlan(ids, cached, torch.cat([selector.initial(), suffix]), selector=selector,
                    chunk_range=chunks, preloaded=attention is not None, feed=feed)


def new_stats(layout: PromptLayout, config: BlendConfig) -> RequestStats:
    blend = config.mode == "blend"
    return RequestStats(
        mode=config.mode, selector=config.selector if blend else None,
        ratio=config.ratio if blend else None,
        prompt_tokens=layout.num_tokens, prefix_tokens=len(layout.prefix_ids),
        chunk_tokens=layout.suffix_start - len(layout.prefix_ids),
        suffix_tokens=len(layout.suffix_ids),
        chunks=len(layout.chunk_ids),
    )


def _whole(kv: ChunkKV | LayeredEntry | None) -> ChunkKV | None:
    """A cached KV in full (an opened entry is read through): what computing a chunk after it
    needs."""
    return kv if kv is None or isinstance(kv, ChunkKV) else kv.materialize()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # the logits are ready: what the first token waits for
        torch.cuda.synchronize(device)
