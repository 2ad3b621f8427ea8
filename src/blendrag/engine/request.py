"""One prefill request, from the store to the first-token logits: open, plan, run, logits.

``prefill`` runs attempts until one completes. An attempt

1. **opens** the request's cached rows: the longest run of prefix-cache blocks its ids begin
   with (``PrefixCache.match``: an earlier turn of the same chat), copied into the request's
   buffer, then the chunks after them (``ChunkCache.rows_for``: stored entries opened for
   layer-wise reads; chunks the store misses computed and stored now, before the request takes
   the pooled buffer); the loading controller chooses the ratio (``ratio="auto"``);
2. **plans** the layer loop: which tokens are computed (the selector's choice, after the
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

from blendrag.config import BlendConfig
from blendrag.engine.chunk_cache import ChunkCache, RequestRows
from blendrag.engine.controller import LoadingController, decide, observe
from blendrag.engine.fused_kv import FusedKV
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
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayerReadError

log = logging.getLogger(__name__)

EXACT_MODES = ("full", "prefix")  # they take exact prefix-cache rows only


@dataclass(frozen=True)
class Parts:
    """What a request runs on: the engine's collaborators."""

    cache: ChunkCache
    runner: ModelRunner
    controller: LoadingController
    prefix_cache: PrefixCache | None = None


@dataclass
class Prefill:
    """A finished prefill: first-token logits [vocab] (float32), the request's KV and stats;
    ``exact_rows``: its first rows computed as a full prefill computes them (the rest were
    blended or reused)."""

    logits: torch.Tensor
    fused: FusedKV
    stats: RequestStats
    exact_rows: int = 0


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
    failed: dict[str, ChunkKV | None] = {}
    attempts = 0
    while True:
        attempts += 1
        try:
            pre = _attempt(parts, layout, config, capacity, started, failed, watchers, clock)
        except _LoadFailed as exc:
            new = [k for k in exc.keys if k not in failed]
            if not new:  # never opened again: a bug, not a storage failure
                raise exc.cause from exc
            log.warning("cached rows of %d entries failed to load (%s); computing those "
                        "chunks instead", len(new), exc.cause)
            failed.update(dict.fromkeys(new))
            continue
        pre.stats.cache.load_retries = attempts - 1
        return pre


def _attempt(parts: Parts, layout: PromptLayout, config: BlendConfig, capacity: int,
             started: float, failed: dict[str, ChunkKV | None],
             observers: tuple[LayerObserver, ...], clock: PhaseClock) -> Prefill:
    """One attempt; raises ``_LoadFailed`` when cached layers fail to load."""
    clock.restart()
    stats = new_stats(layout, config)
    stats.compute.layers = parts.runner.adapter.num_layers
    before = parts.cache.store.stats()
    t_open = time.perf_counter()
    match = _match(parts.prefix_cache, layout, config)
    try:
        head = _head(layout, config, match.tokens)
        rest = layout if not head or _tail_only(layout, config, head) else _after(layout, head)
        rows = (RequestRows() if head and rest is layout
                else parts.cache.rows_for(rest, config, failed, head))
        with rows:  # 1. open
            pre = _run(parts, layout, rest, config, capacity, started, rows, match, head, stats,
                       observers, clock, t_open)
    finally:
        if parts.prefix_cache is not None:
            parts.prefix_cache.release(match)
    stats.cache.store = parts.cache.store.stats().since(before).to_dict()  # this request's share
    return pre


def _run(parts: Parts, layout: PromptLayout, rest: PromptLayout, config: BlendConfig,
         capacity: int, started: float, rows: RequestRows, match: PrefixMatch, head: int,
         stats: RequestStats, observers: tuple[LayerObserver, ...], clock: PhaseClock,
         t_open: float) -> Prefill:
    """Steps 1 (the rest) to 4 of an attempt over open ``rows``; ``rest``: the layout the plan
    sees (``layout`` itself, or its part after the prefix cache's ``head`` rows)."""
    runner = parts.runner
    _count_rows(stats, rows, head, head <= match.exact_tokens)
    stats.timing.fetch_s = time.perf_counter() - t_open
    clock.lap("fetch")
    feed = runner.feed(rows.segments, parts.controller.config.prefetch_layers)
    try:
        config = _auto_ratio(parts.controller, config, rows, feed, stats)
        t_run = time.perf_counter()
        fused, rope = runner.buffer(capacity), runner.rope(layout.num_tokens)
        if head:
            PrefixCache.copy_into(match, fused, head)
        clock.lap("setup")
        plan = (_tail_plan(runner, layout, head, feed) if rest is layout and head
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
    observe(parts.controller, feed, stats, out.load_work_s + stats.loading.preview_load_work_s)
    return Prefill(logits, fused, stats, _exact_rows(layout, config, head, match))


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


def _count_rows(stats: RequestStats, rows: RequestRows, head: int, head_exact: bool) -> None:
    c = stats.cache
    c.chunk_hits, c.chunk_misses = rows.chunk_hits, rows.chunk_misses
    c.prefix_hit, c.exact_first = rows.prefix_hit or bool(head), rows.exact_first
    c.profiles_computed = rows.profiles_computed
    c.chunks_without_context = rows.chunks_without_context
    c.prefix_cache_tokens, c.prefix_cache_exact = head, (head_exact if head else None)
    c.tokens_reused = head + sum(s.kv.num_tokens for s in rows.segments)


# ---- the prefix cache's part ------------------------------------------------------------------


def _match(cache: PrefixCache | None, layout: PromptLayout, config: BlendConfig) -> PrefixMatch:
    """The prefix-cache blocks the prompt begins with (its last token always computed)."""
    if cache is None:
        return PrefixMatch()
    return cache.match(layout.ids[:-1], exact_only=config.mode in EXACT_MODES)


def _head(layout: PromptLayout, config: BlendConfig, cached: int) -> int:
    """How many prefix-cache rows the request takes: all of them when everything after them is
    computed (``full``; ``prefix`` past its first chunk; ``reuse``/``blend`` past the chunks);
    else (``reuse``, ``blend``) up to the last chunk boundary they cover, the chunks after it
    blended as usual; 0 when they cover less than the prompt's prefix."""
    if not cached:
        return 0
    if config.mode == "full" or cached >= layout.suffix_start:
        return cached
    if config.mode == "prefix":  # past its one reused chunk, or nothing
        return cached if not layout.chunk_spans or cached >= layout.chunk_spans[0][1] else 0
    ends = [end for _, end in layout.chunk_spans if end <= cached]
    if ends:
        return ends[-1]
    return len(layout.prefix_ids) if layout.prefix_ids and cached >= len(layout.prefix_ids) else 0


def _tail_only(layout: PromptLayout, config: BlendConfig, head: int) -> bool:
    """Whether everything after the prefix cache's rows is computed (no chunk left to reuse)."""
    return config.mode in EXACT_MODES or head >= layout.suffix_start


def _after(layout: PromptLayout, head: int) -> PromptLayout:
    """``layout`` seen from a chunk boundary ``head``: rows [0, head) as its prefix, the chunks
    after it, the same suffix and chunk prefix (the same ids at the same positions)."""
    ids = layout.ids
    chunks = [c for (_, end), c in zip(layout.chunk_spans, layout.chunk_ids) if end > head]
    return PromptLayout(ids[:head], chunks, layout.suffix_ids, layout.chunk_prefix_ids)


def _tail_plan(runner: ModelRunner, layout: PromptLayout, head: int,
               feed: LayerFeed) -> LoopPlan:
    """Every token after the prefix cache's ``head`` rows computed."""
    n, dev = layout.num_tokens, runner.device
    return LoopPlan(torch.tensor(layout.ids, device=dev), torch.arange(head, n, device=dev),
                    feed=feed)


def _exact_rows(layout: PromptLayout, config: BlendConfig, head: int,
                match: PrefixMatch) -> int:
    """How many of the request's first rows are exact: all in the exact modes (they take exact
    blocks only) and when only a tail was computed after exact rows; else the exact part of
    the prefix cache's rows, or the prompt's prefix (its rows are always exact)."""
    n = layout.num_tokens
    if config.mode in EXACT_MODES or (head >= layout.suffix_start and head <= match.exact_tokens):
        return n
    if head:
        return min(head, match.exact_tokens)
    return len(layout.prefix_ids)


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
              fused: FusedKV, rope: RopeTable, stats: RequestStats, feed: LayerFeed | None,
              clock: PhaseClock = OFF) -> LoopPlan:
    """The layer loop's plan for ``config``: which rows are cached, which tokens computed (the
    blend selector's choice, after the preview pass for ``preview``)."""
    dev, n = runner.device, layout.num_tokens
    ids = torch.tensor(layout.ids, device=dev)
    first_computed = rows.segments[-1].end if rows.segments else 0
    if config.mode != "blend":
        return LoopPlan(ids, torch.arange(first_computed, n, device=dev), feed=feed)
    chunk_start, suffix_start = len(layout.prefix_ids), layout.suffix_start
    chunk_kvs = [s.kv for s in rows.segments if s.start >= chunk_start]
    attention = None
    if config.selector == "preview":  # where the question looks, over the cached rows
        clock.lap("plan")
        preview = suffix_attention(runner, layout, fused, rope, feed)
        attention, stats.compute.preview_attended_keys, stats.loading.preview_load_work_s = preview
        stats.compute.preview_tokens = len(layout.suffix_ids)
        feed = None  # the preview pass loaded every cached row into the buffer
        clock.lap("preview")
    selector = make_selector(config, layout, runner.adapter.num_layers, dev,
                             runner.adapter.scaling, chunk_kvs, attention)
    clock.lap("plan")
    suffix = torch.arange(suffix_start, n, device=dev)
    return LoopPlan(ids, torch.cat([selector.initial(), suffix]), feed=feed, selector=selector)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":  # the logits are ready: what the first token waits for
        torch.cuda.synchronize(device)
