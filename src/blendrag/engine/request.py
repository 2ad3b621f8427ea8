"""One prefill request, from the store to the first-token logits: open, plan, run, logits.

``prefill`` runs attempts until one completes. An attempt

1. **opens** the request's cached rows: its head, the longest run of prefix-cache blocks its
   ids begin with (an earlier turn of the same chat; engine/head.py says how far a request
   takes them), then the chunks after it (``ChunkCache.rows_for``: stored entries opened for
   layer-wise reads; chunks the store misses computed and stored now, before the request takes
   the pooled buffer); the loading controller chooses the ratio (``ratio="auto"``);
2. **plans** the layer loop: which tokens are computed (every one after the head when only a
   tail is left; else the selector's choice over the chunks after it, after the
   preview pass for ``preview``: a loop over the suffix alone that also loads every cached row
   into the request's buffer, so the blend pass after it has none to load);
3. **runs** the loop with a ``LayerFeed`` that reads the cached rows, pipelined or not;
4. takes the **logits** of the last token: the time from the request's start to here is its
   TTFT, measured here only.

A cached entry whose layer fails to load midway (a tier error, a checksum) is never used: the
attempt is dropped, every entry that fails at that layer too is found at once, and the next
attempt computes those chunks instead, each once whatever the attempts (``load_retries``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import blendrag.engine.head as head
from blendrag.config import BlendConfig
from blendrag.engine.ape import ApeSpan
from blendrag.engine.chunk_cache import ChunkCache, RequestRows
from blendrag.engine.controller import LoadingController, decide, observe
from blendrag.engine.costs import PromptShape
from blendrag.engine.fused_kv import FusedKV
from blendrag.engine.history import HISTORY_TAG, HistoryCache, HistoryRows
from blendrag.engine.layer_feed import LayerFeed
from blendrag.engine.loop import LoopPlan
from blendrag.engine.observers import LayerCounts, LayerObserver
from blendrag.engine.phases import OFF, PhaseClock
from blendrag.engine.prefix_cache import PrefixCache, PrefixMatch
from blendrag.engine.preview import suffix_attention
from blendrag.engine.runner import ModelRunner
from blendrag.engine.selectors import make_selector
from blendrag.engine.stats import RequestStats, new_stats
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.model.rope import RopeTables
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayerReadError

log = logging.getLogger(__name__)
FULL = BlendConfig(mode="full")

@dataclass(frozen=True)
class Parts:
    """What a request runs on: the engine's collaborators."""

    cache: ChunkCache
    runner: ModelRunner
    controller: LoadingController
    prefix_cache: PrefixCache | None = None
    history: HistoryCache | None = None


@dataclass
class Prefill:
    """A finished prefill: first-token logits [vocab] (float32), the request's KV and stats;
    ``exact_rows``: its first rows computed as a full prefill computes them (the rest were
    blended or reused); ``conversation_start``: where the rows after the prompt's last chunk
    begin (what the history cache keeps of it)."""

    logits: torch.Tensor
    fused: FusedKV
    stats: RequestStats
    exact_rows: int = 0
    conversation_start: int = 0


class _LoadFailed(Exception):
    """Entries whose layer failed to load in an attempt (``keys``; ``cause``: the first)."""

    def __init__(self, keys: list[str], cause: LayerReadError) -> None:
        super().__init__(f"{len(keys)} cached entries failed to load")
        self.keys, self.cause = keys, cause


def prefill(parts: Parts, layout: PromptLayout, config: BlendConfig, capacity: int,
            started: float, observers: Sequence[LayerObserver] = ()) -> Prefill:
    """Prefill ``layout`` (already length-checked) into a buffer of ``capacity`` rows;
    ``started``: when the request arrived (``time.perf_counter()``), where its TTFT starts.
    ``observers``: the main pass's layer observers (a ``PhaseClock`` among them times every
    phase). See the module docstring for the attempts (``stats.cache.load_retries``)."""
    clock = next((o for o in observers if isinstance(o, PhaseClock)), OFF)
    watchers = tuple(o for o in observers if not isinstance(o, PhaseClock))
    conversation_start = layout.suffix_start
    layout, history = _history(parts, layout, config)
    config, choice = _mode_for(parts, layout, config, history)
    failed: dict[str, ChunkKV | None] = {}
    attempts = 0
    while True:
        attempts += 1
        try:
            pre = _attempt(parts, (layout, history), config, capacity, started, failed, watchers,
                           clock)
        except _LoadFailed as exc:
            new = [k for k in exc.keys if k not in failed]
            if not new:  # never opened again: a bug, not a storage failure
                raise exc.cause from exc
            log.warning("cached rows of %d entries failed to load (%s); computing those "
                        "chunks instead", len(new), exc.cause)
            failed.update(dict.fromkeys(new))
            continue
        pre.stats.cache.load_retries = attempts - 1
        pre.conversation_start = conversation_start
        if choice is not None:
            pre.stats.controller = {**(pre.stats.controller or {}), "mode": choice}
            passes = choice["full_passes_s" if choice["ran"] != choice["asked"] else "passes_s"]
            parts.runner.costs().observe(choice["ran"], passes, pre.stats.timing.ttft_s)
        return pre


def _history(parts: Parts, layout: PromptLayout,
             config: BlendConfig) -> tuple[PromptLayout, HistoryRows | None]:
    """``layout`` with the rows of an earlier turn its suffix begins with as one more chunk
    (engine/history.py), for the modes that reuse rows in a new context; else as it is."""
    if parts.history is None or config.mode not in ("blend", "reuse"):
        return layout, None
    return parts.history.split(layout)


def _mode_for(parts: Parts, layout: PromptLayout, config: BlendConfig,
              history: HistoryRows | None = None) -> tuple[BlendConfig, dict | None]:
    """``config``, or a full prefill when this device's cost profile (engine/costs.py) predicts
    that ``config`` would be slower (``LoadingConfig.full_when_faster``); and the choice's
    record (None: not asked). Not asked of a request that begins with prefix-cache rows
    (every mode then computes little) or that is a full prefill already."""
    wanted = parts.controller.config.full_when_faster
    if wanted is None:
        wanted = parts.runner.device.type == "cuda"
    if not wanted or config.mode == "full" or _has_head(parts, layout, config):
        return config, None
    misses = tuple(parts.cache.miss_passes(layout, config, history))
    costs = parts.runner.costs()
    shape = PromptShape(layout.num_tokens, len(layout.prefix_ids),
                        layout.suffix_start - len(layout.prefix_ids), len(layout.suffix_ids),
                        layout.chunk_spans[0][1], misses)
    passes_s, full_passes_s = costs.predict(config, shape), costs.predict(FULL, shape)
    mode_s = passes_s + costs.overhead(config.label)  # what its passes leave out, measured
    full_s = full_passes_s + costs.overhead(FULL.label)
    record = {"asked": config.label, "ran": config.label, "predicted_s": mode_s,
              "full_predicted_s": full_s, "passes_s": passes_s, "full_passes_s": full_passes_s,
              "miss_passes": len(misses)}
    if mode_s <= full_s:
        return config, record
    record["ran"] = FULL.label
    log.info("%s predicted slower than a full prefill here (%.1f ms vs %.1f ms): running a "
             "full prefill", config.label, mode_s * 1e3, full_s * 1e3)
    return FULL, record


def _has_head(parts: Parts, layout: PromptLayout, config: BlendConfig) -> bool:
    cache = parts.prefix_cache
    if cache is None:
        return False
    found = head.match(cache, layout, config)
    cache.release(found)
    return found.tokens > 0


def _attempt(parts: Parts, prompt: tuple[PromptLayout, HistoryRows | None], config: BlendConfig,
             capacity: int, started: float, failed: dict[str, ChunkKV | None],
             observers: tuple[LayerObserver, ...], clock: PhaseClock) -> Prefill:
    """One attempt over ``prompt`` (the layout, the history rows of its last chunk if any);
    raises ``_LoadFailed`` when cached layers fail to load."""
    layout, history = prompt
    clock.restart()
    stats = new_stats(layout, config)
    stats.compute.layers = parts.runner.adapter.num_layers
    before = parts.cache.store.stats()
    t_open = time.perf_counter()
    cache = parts.prefix_cache
    found = PrefixMatch() if cache is None else head.match(cache, layout, config)
    try:
        start = head.NO_HEAD if cache is None else head.head_for(layout, config, found)
        tail = bool(start.rows) and head.tail_only(layout, config, start)
        rest = layout if not start.rows or tail else head.after(layout, start)
        rows = RequestRows() if tail else parts.cache.rows_for(rest, config, failed, start.rows,
                                                               history)
        with rows:  # 1. open
            pre = _run(parts, layout, rest, config, capacity, started, rows, (start, found, tail),
                       stats, observers, clock, t_open)
    finally:
        if cache is not None:
            cache.release(found)
    stats.cache.store = parts.cache.store.stats().since(before).to_dict()  # this request's share
    return pre


def _run(parts: Parts, layout: PromptLayout, rest: PromptLayout, config: BlendConfig,
         capacity: int, started: float, rows: RequestRows,
         start: tuple[head.Head, PrefixMatch, bool], stats: RequestStats,
         observers: tuple[LayerObserver, ...], clock: PhaseClock, t_open: float) -> Prefill:
    """Steps 1 (the rest) to 4 of an attempt over open ``rows``; ``rest``: the layout the plan
    sees (``layout`` itself, or its part after the head); ``start``: the head, the prefix
    cache's match it comes from, whether only a tail is computed after it."""
    runner, (first, found, tail) = parts.runner, start
    # rows_for numbered the chunks of ``rest``: those before the head are not in it
    _count_rows(stats, rows, first, len(layout.chunk_ids) - len(rest.chunk_ids))
    stats.timing.fetch_s = time.perf_counter() - t_open
    clock.lap("fetch")
    t_run = time.perf_counter()
    fused, rope = runner.buffer(capacity), runner.rope(layout.num_tokens)
    # a timed request places the rows on the loop's thread, where its clock sees them
    feed = runner.feed(rows.segments, fused, rope, parts.controller.config.prefetch_layers,
                       place_ahead=clock is OFF)
    try:
        config = _auto_ratio(parts.controller, config, rows, feed, stats)
        if first.rows:
            head.fill(runner, layout, first, found, fused, rope, clock)
        clock.lap("setup")
        plan = (head.tail_plan(runner, layout, first, feed) if tail
                else make_plan(runner, rest, config, rows, fused, rope, stats, feed, clock))  # 2
        counts = LayerCounts((len(layout.prefix_ids), layout.suffix_start))
        out = runner.run(plan, fused, rope, (counts, *observers), clock)  # 3. run
        logits = runner.logits(out.hidden)  # 4. logits
        clock.lap("logits")
        _sync(runner.device)
        stats.timing.prefill_s = time.perf_counter() - t_run
        stats.timing.ttft_s = time.perf_counter() - started
    except LayerReadError as exc:
        feed.close()  # the reader stopped: the entries may be read here
        raise _LoadFailed([exc.key, *_failing_at(rows, exc.layer, exc.key)], exc) from exc
    finally:
        feed.close()
    stats.compute.computed_per_layer = counts.computed
    stats.compute.recomputed_chunk_tokens_per_layer = counts.chunk_computed
    stats.compute.attended_keys_per_layer = counts.attended_keys
    observe(parts.controller, feed, stats)
    return Prefill(logits, fused, stats, head.exact_rows(layout, config, first))


def _failing_at(rows: RequestRows, layer: int, known: str) -> list[str]:
    """The other opened entries whose ``layer`` fails to load too: found now, so that one
    retry computes them all (not one attempt per bad entry)."""
    bad = []
    for seg in rows.segments:
        if seg.kv.tier == "computed" or seg.kv.key == known:
            continue
        try:
            seg.kv.layer(layer)
        except LayerReadError as exc:
            bad.append(exc.key)
    return bad


def _count_rows(stats: RequestStats, rows: RequestRows, first: head.Head, skipped: int) -> None:
    """``skipped``: chunks of the layout before ``rows``' first (taken whole by the head)."""
    c = stats.cache
    c.chunk_hits, c.chunk_misses = rows.chunk_hits, rows.chunk_misses
    c.hit_chunks = [skipped + i for i in rows.hit_chunks]
    c.prefix_hit, c.exact_first = rows.prefix_hit or bool(first.rows), rows.exact_first
    c.profiles_computed = rows.profiles_computed
    c.chunks_without_context = rows.chunks_without_context
    c.prefix_cache_tokens = first.taken
    c.prefix_cache_exact = first.exact >= first.rows if first.rows else None
    stats.compute.bridged_tokens = first.bridge
    c.tokens_reused = first.taken + sum(s.kv.num_tokens for s in rows.segments)
    c.history_tokens = sum(s.kv.num_tokens for s in rows.segments if s.kv.tier == HISTORY_TAG)


# ---- plan -------------------------------------------------------------------------------------


def _auto_ratio(controller: LoadingController, config: BlendConfig, rows: RequestRows,
                feed: LayerFeed, stats: RequestStats) -> BlendConfig:
    """``config`` at the controller's ratio when it asks for one (``ratio="auto"``)."""
    if config.mode != "blend" or not config.auto_ratio:
        return config
    ratio, stats.controller = decide(controller, config, rows.segments, feed, stats)
    stats.ratio = ratio
    return config.at_ratio(ratio)


def make_plan(runner: ModelRunner, layout: PromptLayout, config: BlendConfig, rows: RequestRows,
              fused: FusedKV, rope: RopeTables, stats: RequestStats, feed: LayerFeed | None,
              clock: PhaseClock = OFF) -> LoopPlan:
    """The layer loop's plan for ``config``: which rows are cached, which tokens computed (the
    blend selector's choice, after the preview pass for ``preview``)."""
    dev, n = runner.device, layout.num_tokens
    ids = torch.tensor(layout.ids, device=dev)
    first_computed = rows.segments[-1].end if rows.segments else 0
    chunk_start, suffix_start = len(layout.prefix_ids), layout.suffix_start
    ape = None if config.ape is None else ApeSpan(config.ape, chunk_start, suffix_start)
    if ape is not None and runner.adapter.attn_softcap is not None:
        raise ValueError("APE (BlendConfig.ape) does not run on soft-capped attention (Gemma 2)")
    if config.mode != "blend":
        return LoopPlan(ids, torch.arange(first_computed, n, device=dev), feed=feed, ape=ape)
    chunk_kvs = [s.kv for s in rows.segments if s.start >= chunk_start]
    attention = None
    if config.selector == "preview":  # where the question looks, over the cached rows
        clock.lap("plan")
        attention, stats.compute.preview_attended_keys = suffix_attention(runner, layout, fused,
                                                                          rope, feed)
        stats.compute.preview_tokens = len(layout.suffix_ids)
        feed = None  # the preview pass loaded every cached row into the buffer
        clock.lap("preview")
    selector = make_selector(config, layout, runner.adapter.num_layers, dev,
                             runner.adapter.scaling, chunk_kvs, attention,
                             runner.adapter.attn_softcap)
    clock.lap("plan")
    suffix = torch.arange(suffix_start, n, device=dev)
    return LoopPlan(ids, torch.cat([selector.initial(), suffix]), feed=feed, selector=selector,
                    ape=ape)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # the logits are ready: what the first token waits for
        torch.cuda.synchronize(device)
