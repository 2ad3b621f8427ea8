"""One prefill request, from the store to the first-token logits: open, plan, run, logits.

A ``Request`` (engine/request/request.py) carries what was asked (layout, config, capacity,
arrival time, observers) and what lasts across attempts; before the first, the history
cache's rows are split off as one more chunk and the mode it runs is decided
(engine/request/mode.py: a full prefill instead when its chunks are missing or the cost
profile predicts it faster). ``prefill`` runs attempts until one completes. An attempt

1. **opens** the request's cached rows (``Opened``): its head, how far it takes the longest
   run of prefix-cache blocks its ids begin with (an earlier turn of the same chat;
   engine/request/head.py), then the chunks after it (``ChunkCache.rows_for``: stored entries opened
   for layer-wise reads; chunks the store misses computed and stored now, before the request
   takes the pooled buffer);
2. takes the buffer, RoPE tables and layer feed (``Running``), the controller's ratio
   (``ratio="auto"``), writes the head's rows, and **plans** the layer loop: which tokens are
   computed (every one after the head when only a tail is left; else the selector's choice
   over the chunks after it, after the preview pass for ``preview``: a loop over the suffix
   alone that also loads every cached row into the request's buffer, so the blend pass after
   it has none to load);
3. **runs** the loop with the feed, pipelined or not;
4. takes the **logits** of the last token: the time from the request's start to here is its
   TTFT, measured here only.

The attempts are steps (``prefill_steps``, engine/request/steps.py) that stop at each pass over
the cached rows (the preview pass, the main pass): ``prefill`` runs each alone, a scheduler may
pack several requests' passes into one forward (engine/request/packing.py).

A cached entry whose layer fails to load midway (a tier error, a checksum) is never used: the
attempt is dropped, every entry that fails at that layer too is found at once, and the next
attempt computes those chunks instead, each once whatever the attempts (``load_retries``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

import blendrag.engine.request.head as head_rules
from blendrag.engine.caches.history import HISTORY_TAG
from blendrag.engine.caches.prefix_cache import PrefixCache, PrefixMatch
from blendrag.engine.caches.request_rows import RequestRows
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer_feed import LayerFeed, tensor_on
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.compute.observers import OFF, LayerCounts, LayerObserver, PhaseClock
from blendrag.engine.request.mode import mode_for, with_history
from blendrag.engine.request.request import Parts, Request
from blendrag.engine.request.stats import RequestStats, new_stats
from blendrag.engine.request.steps import CachedPass, Steps, run_alone, stop_at
from blendrag.engine.selection.ape import ApeSpan
from blendrag.engine.selection.controller import LoadingController, decide, observe
from blendrag.engine.selection.costs import observe_choice
from blendrag.engine.selection.preview import PreviewPass
from blendrag.engine.selection.selectors import make_selector
from blendrag.model.rope import RopeTables
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayerReadError

log = logging.getLogger(__name__)


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


@dataclass
class Opened:
    """What an attempt opened: ``found``, the prefix cache's blocks it holds; ``head``, how far
    it takes them (engine/request/head.py); ``tail``, every token after the head computed; ``rest``,
    the layout its plan sees (the request's, or its part after the head); ``rows``, the cached
    rows of the chunks after the head."""

    found: PrefixMatch
    head: head_rules.Head
    tail: bool
    rest: PromptLayout
    rows: RequestRows


@dataclass
class Running:
    """What a running attempt holds: its KV (``fused``), RoPE tables, the feed that places
    the cached rows layer by layer, and the preview pass once it has run (its counts are read
    with the stats, after the logits)."""

    fused: FusedKV
    rope: RopeTables
    feed: LayerFeed
    preview: PreviewPass | None = None


def _clock(req: Request) -> PhaseClock:
    """The observer that times the request's phases (``OFF``: none)."""
    return next((o for o in req.observers if isinstance(o, PhaseClock)), OFF)


def _watchers(req: Request) -> tuple[LayerObserver, ...]:
    """The request's observers besides the clock."""
    return tuple(o for o in req.observers if not isinstance(o, PhaseClock))


class _LoadFailed(Exception):
    """Entries whose layer failed to load in an attempt (``keys``; ``cause``: the first)."""

    def __init__(self, keys: list[str], cause: LayerReadError) -> None:
        super().__init__(f"{len(keys)} cached entries failed to load")
        self.keys, self.cause = keys, cause


def prefill(parts: Parts, req: Request) -> Prefill:
    """Prefill ``req`` into a buffer of ``req.capacity`` rows: attempts until one completes
    (the module docstring; ``stats.cache.load_retries``)."""
    return run_alone(parts.runner, prefill_steps(parts, req))


def prefill_steps(parts: Parts, req: Request) -> Steps[Prefill]:
    """``prefill`` as steps (``Steps``): attempts until one completes, each stopping at each of
    its passes over the cached rows."""
    conversation_start = req.layout.suffix_start
    req.layout, req.history = with_history(parts, req.layout, req.config)
    req.config, req.choice = mode_for(parts, req)
    attempts = 0
    while True:
        attempts += 1
        try:
            pre = yield from _attempt(parts, req)
        except _LoadFailed as exc:
            new = [k for k in exc.keys if k not in req.failed]
            if not new:  # never opened again: a bug, not a storage failure
                raise exc.cause from exc
            log.warning("cached rows of %d entries failed to load (%s); computing those "
                        "chunks instead", len(new), exc.cause)
            req.failed.update(dict.fromkeys(new))
            continue
        pre.stats.cache.load_retries = attempts - 1
        pre.conversation_start = conversation_start
        pre.stats.cache.backfilled = req.backfilled
        if req.choice is not None:
            pre.stats.controller.mode = req.choice
            if req.choice.reason == "predicted":  # the profile's own prediction, checked
                observe_choice(parts.runner.costs(), req.choice, pre.stats)
        return pre



# ---- 1. open ----------------------------------------------------------------------------------


def _attempt(parts: Parts, req: Request) -> Steps[Prefill]:
    """One attempt; raises ``_LoadFailed`` when cached layers fail to load."""
    _clock(req).restart()
    req.stats = new_stats(req.layout, req.config)
    req.stats.compute.layers = parts.runner.adapter.num_layers
    before = parts.cache.store.stats()
    t_open = time.perf_counter()
    cache = parts.prefix_cache
    found = PrefixMatch() if cache is None else head_rules.match(cache, req.layout, req.config)
    try:
        try:
            opened = _open(parts, req, found)
        except LayerReadError as exc:  # an entry read whole while opening (a profile to take)
            raise _LoadFailed([exc.key], exc) from exc
        with opened.rows:
            pre = yield from _run(parts, req, opened, t_open)
    finally:
        if cache is not None:
            cache.release(found)
    req.stats.cache.store = parts.cache.store.stats().since(before).to_dict()  # its share
    return pre


def _open(parts: Parts, req: Request, found: PrefixMatch) -> Opened:
    """The request's head (how far it takes the prefix cache's ``found`` rows), then the cached
    rows of the chunks after it."""
    layout, config = req.layout, req.config
    first = (head_rules.NO_HEAD if parts.prefix_cache is None
             else head_rules.head_for(layout, config, found))
    tail = bool(first.rows) and head_rules.tail_only(layout, config, first)
    rest = layout if not first.rows or tail else head_rules.after(layout, first)
    rows = (RequestRows() if tail else
            parts.cache.rows_for(rest, config, req.failed, first.rows, req.history))
    return Opened(found, first, tail, rest, rows)


def _count_rows(stats: RequestStats, layout: PromptLayout, opened: Opened) -> None:
    """Where the request's rows came from."""
    c, rows, first = stats.cache, opened.rows, opened.head
    # rows_for numbered the chunks of ``rest``: those before the head are not in it
    skipped = len(layout.chunk_ids) - len(opened.rest.chunk_ids)
    c.chunk_hits, c.chunk_misses = rows.chunk_hits, rows.chunk_misses
    c.device_hits = rows.device_hits
    c.hit_chunks = [skipped + i for i in rows.hit_chunks]
    c.prefix_hit, c.exact_first = rows.prefix_hit or bool(first.rows), rows.exact_first
    c.profiles_computed = rows.profiles_computed
    c.chunks_without_context = rows.chunks_without_context
    c.prefix_cache_tokens = first.taken
    c.prefix_cache_exact = first.exact >= first.rows if first.rows else None
    stats.compute.bridged_tokens = first.bridge
    c.tokens_reused = first.taken + sum(s.kv.num_tokens for s in rows.segments)
    c.history_tokens = sum(s.kv.num_tokens for s in rows.segments if s.kv.tier == HISTORY_TAG)


# ---- 2. plan, 3. run, 4. logits ---------------------------------------------------------------


def _run(parts: Parts, req: Request, opened: Opened, t_open: float) -> Steps[Prefill]:
    """Steps 2 to 4 over the opened rows: the buffer and the feed, the ratio, the head's rows,
    the plan, the loop, the logits."""
    runner, clock, stats = parts.runner, _clock(req), req.stats
    _count_rows(stats, req.layout, opened)
    stats.timing.fetch_s = time.perf_counter() - t_open
    clock.lap("fetch")
    t_run = time.perf_counter()
    fused, rope = runner.buffer(req.capacity), runner.rope(req.layout.num_tokens)
    fused.drop_earlier_rows(req.layout.num_tokens)  # no pass reads an earlier request's rows
    # a timed request places the rows on the loop's thread, where its clock sees them
    feed = runner.feed(opened.rows.segments, fused, rope,
                       parts.controller.config.prefetch_layers, place_ahead=clock is OFF)
    running = Running(fused, rope, feed)
    try:
        _auto_ratio(parts.controller, req, opened, running)
        _fill_head(parts, req, opened, running)
        clock.lap("setup")
        plan = (_tail_plan(parts, req, opened, running) if opened.tail
                else (yield from make_plan(parts, req, opened, running)))  # 2. plan
        counts = LayerCounts((len(req.layout.prefix_ids), req.layout.suffix_start))
        main = CachedPass(plan, fused, rope, (counts, *_watchers(req)), clock, req.pieces)
        out = yield from stop_at(main, stats)  # 3. run: alone, or packed with others
        stats.compute.packed_requests = main.packed
        logits = runner.logits(out.hidden)  # 4. logits
        clock.lap("logits")
        _sync(runner.device)
        stats.timing.prefill_s = time.perf_counter() - t_run
        stats.timing.between_pieces_s = req.pieces.between_s if req.pieces is not None else 0.0
        stats.timing.ttft_s = time.perf_counter() - req.started
    except LayerReadError as exc:
        feed.close()  # the reader stopped: the entries may be read here
        failing = opened.rows.failing_at(exc.layer, exc.key)
        raise _LoadFailed([exc.key, *failing], exc) from exc
    finally:
        feed.close()
    stats.compute.computed_per_layer = counts.computed
    stats.compute.recomputed_chunk_tokens_per_layer = counts.chunk_computed
    stats.compute.attended_keys_per_layer = counts.attended_keys
    if running.preview is not None:
        stats.compute.preview_attended_keys = running.preview.attended_keys
    observe(parts.controller, feed, stats)
    return Prefill(logits, fused, stats, head_rules.exact_rows(req.layout, req.config,
                                                               opened.head))


def _auto_ratio(controller: LoadingController, req: Request, opened: Opened,
                running: Running) -> None:
    """``req.config`` at the controller's ratio when it asks for one (``ratio="auto"``)."""
    config, stats = req.config, req.stats
    if config.mode != "blend" or not config.auto_ratio:
        return
    ratio, stats.controller.ratio = decide(controller, config, opened.rows.segments,
                                           running.feed, stats)
    stats.ratio = ratio
    req.config = config.at_ratio(ratio)


def _fill_head(parts: Parts, req: Request, opened: Opened, running: Running) -> None:
    """Write the head's rows into the request's KV: the prefix cache's, then the bridge's (the
    rest of the piece they stop in, computed after them)."""
    first = opened.head
    if not first.rows:
        return
    PrefixCache.copy_into(opened.found, running.fused, first.taken)
    if first.bridge:
        dev = parts.runner.device
        ids = tensor_on(req.layout.ids[:first.rows], dev)
        out = parts.runner.run(LoopPlan(ids, torch.arange(first.taken, first.rows, device=dev)),
                               running.fused, running.rope, (), _clock(req))
        req.stats.compute.warming_passes += out.warming


def _tail_plan(parts: Parts, req: Request, opened: Opened, running: Running) -> LoopPlan:
    """Every token after the head computed."""
    n, dev = req.layout.num_tokens, parts.runner.device
    return LoopPlan(tensor_on(req.layout.ids, dev),
                    torch.arange(opened.head.rows, n, device=dev), feed=running.feed)


def make_plan(parts: Parts, req: Request, opened: Opened,
              running: Running) -> Steps[LoopPlan]:
    """The layer loop's plan for ``req.config`` over ``opened.rest``: which rows are cached,
    which tokens computed (the blend selector's choice, after the preview pass for
    ``preview``: a pass of its own, stopped at as the main pass is). Nothing is read back
    between the two passes: the preview's attention stays where it was computed, the
    selection is made there, and on a GPU the blend pass is queued behind the preview."""
    runner, config, rows, layout = parts.runner, req.config, opened.rows, opened.rest
    dev, n = runner.device, layout.num_tokens
    feed: LayerFeed | None = running.feed
    ids = tensor_on(layout.ids, dev)
    first_computed = rows.segments[-1].end if rows.segments else 0
    chunk_start, suffix_start = len(layout.prefix_ids), layout.suffix_start
    ape = None if config.ape is None else ApeSpan(config.ape, chunk_start, suffix_start)
    if ape is not None and runner.adapter.attn_softcap is not None:
        raise ValueError("APE (BlendConfig.ape) does not run on soft-capped attention (Gemma 2)")
    if config.mode != "blend":
        return LoopPlan(ids, torch.arange(first_computed, n, device=dev), feed=feed, ape=ape)
    chunk_kvs = [s.kv for s in rows.segments if s.start >= chunk_start]
    attention = None
    clock = _clock(req)
    if config.selector == "preview":  # where the question looks, over the cached rows
        clock.lap("plan")
        preview = running.preview = PreviewPass(layout, ids, feed)
        yield from stop_at(CachedPass(preview.plan, running.fused, running.rope,
                                      preview.observers, OFF, None, alone=clock is not OFF),
                           req.stats)
        attention = preview.result()
        req.stats.compute.preview_tokens = len(layout.suffix_ids)
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
        # this thread's stream, not the device: a device-wide sync fails while another thread
        # captures a CUDA graph (a prefill worker beside serving's decoding loop; graphs.py)
        torch.cuda.current_stream(device).synchronize()
