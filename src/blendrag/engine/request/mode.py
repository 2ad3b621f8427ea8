"""Which mode a request runs, decided once before its first attempt: the mode it asked for, or
an exact full prefill when its chunks are mostly in no store yet (``full_when_missing``) or when
this device's cost profile predicts a full prefill is faster (``full_when_faster``); and the
rows of an earlier turn its suffix begins with, split off as one more chunk (the history
cache).
"""

from __future__ import annotations

import logging
import math

import blendrag.engine.request.head as head_rules
from blendrag.config import BlendConfig
from blendrag.engine.caches.history import HistoryRows
from blendrag.engine.caches.prefix_cache import PrefixCache
from blendrag.engine.request.request import Parts, Request
from blendrag.engine.request.stats import ModeChoice
from blendrag.engine.selection.costs import PromptShape, choose_mode, exact_path_choice
from blendrag.prompt import PromptLayout

log = logging.getLogger(__name__)
FULL = BlendConfig(mode="full")


def with_history(parts: Parts, layout: PromptLayout,
             config: BlendConfig) -> tuple[PromptLayout, HistoryRows | None]:
    """``layout`` with the rows of an earlier turn its suffix begins with as one more chunk
    (engine/caches/history.py), for the modes that reuse rows in a new context; else as it is."""
    if parts.history is None or config.mode not in ("blend", "reuse"):
        return layout, None
    return parts.history.split(layout)


def mode_for(parts: Parts, req: Request) -> tuple[BlendConfig, ModeChoice | None]:
    """``req.config``, or a full prefill when this device's cost profile predicts that it would
    be slower (``LoadingConfig.full_when_faster``; engine/selection/costs.py ``choose_mode``); and
    the
    choice's record (None: not asked). Not asked of a request that begins with prefix-cache
    rows (every mode then computes little) or that is a full prefill already."""
    layout, config = req.layout, req.config
    if config.mode == "full" or req.as_asked:
        return config, None
    if parts.prefix_cache is not None:
        exact_tokens, cached, head = _cached_heads(parts.prefix_cache, layout, config)
        exact = exact_path_choice(layout, config, exact_tokens, head)
        if exact is not None:
            return FULL, exact
        if cached:  # it begins with prefix-cache rows: every mode computes little
            return config, None
    missing = _missing_first(parts, req)
    if missing is not None:
        return FULL, missing
    wanted = parts.controller.config.full_when_faster
    if wanted is None:
        wanted = parts.runner.device.type == "cuda"
    if not wanted:
        return config, None
    misses = tuple(parts.cache.miss_passes(layout, config, req.history))
    shape = PromptShape(layout.num_tokens, len(layout.prefix_ids),
                        layout.suffix_start - len(layout.prefix_ids), len(layout.suffix_ids),
                        layout.chunk_spans[0][1], misses)
    return choose_mode(parts.runner.costs(), config, shape)


def _missing_first(parts: Parts, req: Request) -> ModeChoice | None:
    """A full prefill's record when at least ``full_when_missing`` of the request's chunk
    tokens are in no store (the first question on new documents): computing them first costs
    several full prefills, so the request runs one, exact, and its missing pieces are queued
    to be computed off its path (engine/caches/backfill.py); None otherwise."""
    share = parts.controller.config.full_when_missing
    if share is None:
        return None
    absent = parts.cache.absent(req.layout, req.config, req.history)
    chunk_tokens = req.layout.suffix_start - len(req.layout.prefix_ids)
    missing = sum(len(p.ids) for p in absent if not p.prefix)  # chunks
    if not absent or chunk_tokens <= 0 or missing < share * chunk_tokens:
        return None
    req.backfilled = parts.cache.backfill_later(absent)
    backfill = parts.cache.backfill
    # on by default: said at WARNING once per engine (a newcomer sees why an asked blend ran
    # full), then at INFO (a service over new documents would say it on every first question)
    level = logging.INFO if backfill.warned else logging.WARNING
    backfill.warned = True
    chunks = sum(not p.prefix for p in absent)
    log.log(level, "%s request: %d of %d chunk tokens (%.0f %%, %d of %d chunks) are in no store "
            "yet, at least the %.0f %% of LoadingConfig.full_when_missing: ran an exact full "
            "prefill instead of computing them first; %d of %d missing pieces (chunks, prefix) "
            "queued to be computed and stored off its path, so the next request over them hits",
            req.config.label, missing, chunk_tokens, 100 * missing / chunk_tokens, chunks,
            len(req.layout.chunk_ids), 100 * share, req.backfilled,
            len({p.key for p in absent}))  # a piece used twice (a separator) is one
    return ModeChoice(req.config.label, FULL.label, math.nan, math.nan, math.nan, math.nan,
                      len(absent), reason="chunks missing")


def _cached_heads(cache: PrefixCache, layout: PromptLayout,
                  config: BlendConfig) -> tuple[int, int, head_rules.Head]:
    """What the prefix cache holds of the prompt's beginning, in one lookup: its exact rows
    (the leading exact run of what ``config`` takes: what the exact path would take), the rows
    ``config`` takes, and the head it would start from."""
    found = head_rules.match(cache, layout, config)
    try:
        return found.exact_tokens, found.tokens, head_rules.head_for(layout, config, found)
    finally:
        cache.release(found)

