"""One prefill request, from the store to the first-token logits: open, plan, run, logits.

``prefill`` runs attempts until one completes. An attempt

1. **opens** the request's cached rows (``ChunkCache.rows_for``: stored entries opened for
   layer-wise reads; chunks the store misses computed and stored now, before the request takes
   the pooled buffer), and lets the loading controller choose the ratio (``ratio="auto"``);
2. **plans** the layer loop: which tokens are computed (the selector's choice, after the preview
   pass for ``preview``: a loop over the suffix alone that also loads every cached row into the
   request's buffer, so the blend pass after it has none to load);
3. **runs** the loop with a ``LayerFeed`` that reads the cached rows, pipelined or not;
4. takes the **logits** of the last token: the time from the request's start to here is its
   TTFT, measured here only.

A cached entry whose layer fails to load midway (a tier error, a checksum) is never used: the
attempt is dropped and the next one computes that chunk instead (``load_retries``).
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
from blendrag.engine.preview import suffix_attention
from blendrag.engine.runner import ModelRunner
from blendrag.engine.selectors import make_selector
from blendrag.engine.stats import RequestStats, new_stats
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayerReadError

log = logging.getLogger(__name__)


@dataclass
class Prefill:
    """A finished prefill: first-token logits [vocab] (float32), the request's KV and stats."""

    logits: torch.Tensor
    fused: FusedKV
    stats: RequestStats


def prefill(cache: ChunkCache, runner: ModelRunner, controller: LoadingController,
            layout: PromptLayout, config: BlendConfig, capacity: int, started: float,
            observers: Sequence[LayerObserver] = ()) -> Prefill:
    """Prefill ``layout`` (already length-checked) into a buffer of ``capacity`` rows;
    ``started``: when the request arrived (``time.perf_counter()``), where its TTFT starts.
    ``observers``: the main pass's layer observers (a ``PhaseClock`` among them times every
    phase). See the module docstring for the attempts (``stats.cache.load_retries``)."""
    clock = next((o for o in observers if isinstance(o, PhaseClock)), OFF)
    watchers = tuple(o for o in observers if not isinstance(o, PhaseClock))
    skip: set[str] = set()
    while True:
        try:
            pre = _attempt(cache, runner, controller, layout, config, capacity, started, skip,
                           watchers, clock)
        except LayerReadError as exc:
            if exc.key in skip:  # never opened again: a bug, not a storage failure
                raise
            log.warning("cached rows of entry %s failed to load (%s); computing that chunk "
                        "again", exc.key[:12], exc)
            skip.add(exc.key)
            continue
        pre.stats.cache.load_retries = len(skip)
        return pre


def _attempt(cache: ChunkCache, runner: ModelRunner, controller: LoadingController,
             layout: PromptLayout, config: BlendConfig, capacity: int, started: float,
             skip: set[str], observers: tuple[LayerObserver, ...],
             clock: PhaseClock) -> Prefill:
    """One attempt; raises ``LayerReadError`` when a cached layer fails to load."""
    clock.restart()
    stats = new_stats(layout, config)
    stats.compute.layers = runner.adapter.num_layers
    before = cache.store.stats()
    t_open = time.perf_counter()
    with cache.rows_for(layout, config, skip) as rows:  # 1. open
        _count_rows(stats, rows)
        stats.timing.fetch_s = time.perf_counter() - t_open
        clock.lap("fetch")
        feed = runner.feed(rows.segments, controller.config.prefetch_layers)
        try:
            config = _auto_ratio(controller, config, rows, feed, stats)
            t_run = time.perf_counter()
            fused, rope = runner.buffer(capacity), runner.rope(layout.num_tokens)
            clock.lap("setup")
            plan = make_plan(runner, layout, config, rows, fused, rope, stats, feed, clock)  # 2
            counts = LayerCounts((len(layout.prefix_ids), layout.suffix_start))
            out = runner.run(plan, fused, rope, (counts, *observers), clock)  # 3. run
            logits = runner.logits(out.hidden)  # 4. logits
            clock.lap("logits")
            _sync(runner.device)
            stats.timing.prefill_s = time.perf_counter() - t_run
            stats.timing.ttft_s = time.perf_counter() - started
        finally:
            feed.close()
    stats.cache.store = cache.store.stats().since(before).to_dict()  # this request's share
    stats.compute.computed_per_layer = counts.computed
    stats.compute.recomputed_chunk_tokens_per_layer = counts.chunk_computed
    stats.compute.attended_keys_per_layer = counts.attended_keys
    observe(controller, feed, stats, out.load_work_s + stats.loading.preview_load_work_s)
    return Prefill(logits, fused, stats)


def _count_rows(stats: RequestStats, rows: RequestRows) -> None:
    c = stats.cache
    c.chunk_hits, c.chunk_misses = rows.chunk_hits, rows.chunk_misses
    c.prefix_hit, c.exact_first = rows.prefix_hit, rows.exact_first
    c.profiles_computed = rows.profiles_computed
    c.tokens_reused = sum(s.kv.num_tokens for s in rows.segments)


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
