"""A request's head: the rows it starts from, taken from the prefix cache
(engine/caches/prefix_cache.py).

The cache matches whole blocks, so its rows end wherever a block ends: inside the prompt's
prefix, inside a chunk, or past the chunks. What the request does with them depends on its
mode:

- ``full``, ``prefix`` (exact blocks only), and any request whose cached rows reach the
  suffix: every token after them is computed; the plan is the *tail*.
- ``reuse``, ``blend`` with cached rows ending inside a piece (the prefix or a chunk): when they
  cover at least half of that piece, its remaining tokens are computed after them (the
  *bridge*: as exact as the rows before), so the request goes on from the piece's end; else
  they are cut back to the piece's start (the piece comes from the store like any other).
  Either way the chunks after the head are opened and planned as usual (``after``).
- ``prefix`` whose exact rows stop before the end of its one reused chunk: no head at all.

Decisions only: the request path (engine/request/prefill.py) writes the head's rows and runs the
bridge.
"""

from __future__ import annotations

from dataclasses import dataclass

from blendrag.config import BlendConfig
from blendrag.engine.caches.prefix_cache import PrefixCache, PrefixMatch
from blendrag.prompt import PromptLayout

EXACT_MODES = ("full", "prefix")  # they take exact prefix-cache rows only


@dataclass(frozen=True)
class Head:
    """``taken`` rows copied from the prefix cache, then the bridge up to ``rows`` (where the
    request's own plan starts); the first ``exact`` of them are exact."""

    taken: int = 0
    rows: int = 0
    exact: int = 0

    @property
    def bridge(self) -> int:
        return self.rows - self.taken


NO_HEAD = Head()


def match(cache: PrefixCache, layout: PromptLayout, config: BlendConfig) -> PrefixMatch:
    """The cached blocks the prompt begins with (its last token is always computed): exact
    ones only for the exact modes and for a blend that recomputes every chunk token (ratio
    1.0 is a full prefill's answer: no earlier turn's approximate rows under it)."""
    return cache.match(layout.ids[:-1], exact_only=exact_only(config))


def exact_only(config: BlendConfig) -> bool:
    """Whether a request of ``config`` takes exact prefix-cache blocks only."""
    return config.mode in EXACT_MODES or (config.mode == "blend" and config.ratio >= 1.0)


def head_for(layout: PromptLayout, config: BlendConfig, found: PrefixMatch) -> Head:
    """Where a request with ``found`` rows cached starts (see the module docstring)."""
    cached = found.tokens
    if not cached:
        return NO_HEAD
    if config.mode == "full" or cached >= layout.suffix_start:
        return _head(cached, cached, found)
    if config.mode == "prefix":  # past its one reused chunk, or nothing
        spans = layout.chunk_spans
        return _head(cached, cached, found) if not spans or cached >= spans[0][1] else NO_HEAD
    start, end = _piece_at(layout, cached)
    if cached == start:
        return _head(cached, cached, found)
    if cached - start >= end - cached:  # most of the piece cached: compute the rest of it
        return _head(cached, end, found)
    return _head(start, start, found) if start else NO_HEAD


def tail_only(layout: PromptLayout, config: BlendConfig, head: Head) -> bool:
    """Whether every token after the head is computed (no chunk left to reuse)."""
    return config.mode in EXACT_MODES or head.rows >= layout.suffix_start


def after(layout: PromptLayout, head: Head) -> PromptLayout:
    """``layout`` seen from the head, a piece boundary: rows [0, head.rows) as its prefix, the
    chunks after them, the same suffix and chunk prefix (the same ids at the same positions)."""
    ids = layout.ids
    chunks = [c for (_, end), c in zip(layout.chunk_spans, layout.chunk_ids) if end > head.rows]
    return PromptLayout(ids[:head.rows], chunks, layout.suffix_ids, layout.chunk_prefix_ids)


def exact_rows(layout: PromptLayout, config: BlendConfig, head: Head) -> int:
    """How many of the request's first rows are exact: all in the exact modes (they take exact
    blocks only) and when the tail after exact head rows is computed; else, after approximate
    head rows, the head's exact ones only (the prompt's prefix may lie under approximate
    blocks of an earlier turn); else the head's rows or the prompt's prefix (computed, or
    stored from position 0: exact), whichever reaches further."""
    if config.mode in EXACT_MODES or (tail_only(layout, config, head)
                                      and head.exact == head.rows):
        return layout.num_tokens
    if head.exact < head.rows:
        return head.exact
    return max(head.rows, len(layout.prefix_ids))


def _head(taken: int, rows: int, found: PrefixMatch) -> Head:
    # the bridge is exact when every row it follows is
    exact = rows if found.exact_tokens >= taken else found.exact_tokens
    return Head(taken, rows, exact)


def _piece_at(layout: PromptLayout, row: int) -> tuple[int, int]:
    """[start, end) of the piece (the prefix or a chunk) that holds ``row`` or ends at it."""
    pieces = [(0, len(layout.prefix_ids)), *layout.chunk_spans]
    for start, end in pieces:
        if start <= row < end:
            return start, end
    return pieces[-1]
