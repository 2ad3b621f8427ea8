"""The history cache: the rows of earlier turns, found wherever they land in a later prompt.

Conversational RAG sends ``[system][passages retrieved for this turn][the conversation so
far][the new question]`` (LlamaIndex's chat engines, LangChain's history-aware chains). The
passages change at every turn, so the prefix cache (engine/caches/prefix_cache.py) stops at the
system prompt, yet the conversation's rows exist from the turn before, only at other
positions. This cache keeps them as a *history segment* per finished request: the rows after
its last chunk (the end of the system prompt, the messages, the question, the answer the
engine generated), keys un-rotated to pre-RoPE as a stored chunk's are. A later request whose
suffix begins with a run of a kept segment's ids (found by their token content: a segment
indexed by every run of ``ANCHOR`` ids) takes that run as one more chunk of its layout, its
rows placed at their new positions and blended like any chunk (``split``): the same selection,
the same exactness rules. A ``full`` or ``prefix`` request never takes them; with ratio 1.0 every
one of them is computed again.

The run starts where the suffix starts, so that a layout stays ``[prefix][chunks][suffix]`` with
no gap to compute as a chunk (conversation text never goes to the shared chunk store). A
segment whose ids begin another's (the same conversation, one turn later) replaces it.
Segments live on the model's device within ``max_bytes``, the least recently used evicted
first.

An engine's namespace views (``BlendEngine.namespaced``) each have a cache of their own
(``view``) over one pool of segments within the engine's one budget, evicted least recently
used across them all: each segment records its owner (the engine's: its namespace and its
model's fingerprint, so that rows of weights since changed in place are never taken), and a
view finds, and replaces, only its own owner's segments (its anchors are looked up under it).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.model.rope import RopeTables
from blendrag.prompt import PromptLayout

HISTORY_TAG = "history"
"""Context tag of a history segment's rows (they were computed in an earlier turn's context)."""

ANCHOR = 8
"""Ids that locate a run: a suffix is looked up by its first ``ANCHOR`` ids."""

MIN_TOKENS = 16
"""The shortest run taken (a shorter one saves less than its lookup and copy cost)."""

CANDIDATES = 16
"""At most this many places a run may start in the kept segments, the most recent first."""


@dataclass(eq=False)
class Segment:
    """One finished request's rows after its last chunk: ``ids`` and their pre-RoPE keys and
    values, k, v: [layers, kv_heads, T, head_dim]."""

    ids: tuple[int, ...]
    k: torch.Tensor
    v: torch.Tensor
    owner: str = ""  # the namespace (and model fingerprint) whose request made it

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


@dataclass(frozen=True)
class HistoryRows:
    """Rows of an earlier turn a request takes: the chunk that starts at row ``start`` of its
    layout, ``kv`` its rows (pre-RoPE keys, tagged ``HISTORY_TAG``)."""

    start: int
    kv: ChunkKV

    @property
    def tokens(self) -> int:
        return self.kv.num_tokens


class _Pool:
    """The segments of every view of one history cache, within one budget (``max_bytes``)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.segments: OrderedDict[int, Segment] = OrderedDict()  # by id(), oldest first
        # (namespace, ANCHOR ids) -> the places those ids start in that namespace's segments
        self.anchors: dict[tuple[str, tuple[int, ...]], list[tuple[Segment, int]]] = {}
        self.bytes = 0
        self.lock = threading.Lock()


class HistoryCache:
    """History segments of finished requests, at most ``max_bytes`` on the model's device.
    ``min_tokens``: the shortest run a request takes. ``owner()``: whose segments this cache
    keeps and finds (the engine's namespace and model fingerprint, current when asked;
    default: one owner "")."""

    def __init__(self, max_bytes: int, min_tokens: int = MIN_TOKENS,
                 owner: Callable[[], str] | None = None) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"history cache bytes must be an integer >= 0, got {max_bytes!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) \
                or min_tokens < ANCHOR:
            raise ValueError(f"min_tokens must be an integer >= {ANCHOR}, got {min_tokens!r}")
        self.min_tokens = min_tokens
        self.owner: Callable[[], str] = owner if owner is not None else _no_namespace
        self._pool = _Pool(max_bytes)

    def view(self, owner: Callable[[], str]) -> HistoryCache:
        """A cache for the namespace ``owner()`` over this one's segments and budget: neither
        ever finds or replaces the other's segments; both are evicted least recently used
        within the one budget."""
        view = HistoryCache(self.max_bytes, self.min_tokens, owner)
        view._pool = self._pool
        return view

    @property
    def max_bytes(self) -> int:
        """The budget, shared by every view."""
        return self._pool.max_bytes

    @property
    def bytes(self) -> int:
        """Bytes of the segments held now, every view's."""
        return self._pool.bytes

    def __len__(self) -> int:
        return len(self._pool.segments)

    # ---- keep ------------------------------------------------------------------------------

    def keep(self, ids: Sequence[int], start: int, fused: FusedKV, rope: RopeTables) -> None:
        """Keep rows [start, len(ids)) of ``fused`` (the rows of ``ids``, keys rotated at their
        positions; ``rope`` covers them) as a segment; a kept segment of the same namespace
        whose ids begin the new one's is dropped (the new one holds it)."""
        end = min(len(ids), fused.length)
        if end - start < self.min_tokens:
            return
        k = _unrotate(fused.k[:, :, start:end], rope, start)  # [L, Hkv, T, D] pre-RoPE
        owner, pool = self.owner(), self._pool
        segment = Segment(tuple(int(t) for t in ids[start:end]), k,
                          fused.v[:, :, start:end].clone(), owner)
        if segment.nbytes > pool.max_bytes:
            return
        with pool.lock:
            for old in list(pool.segments.values()):
                if old.owner == owner and segment.ids[:len(old.ids)] == old.ids:
                    self._drop(old)
            pool.segments[id(segment)] = segment
            pool.bytes += segment.nbytes
            for pos in range(len(segment.ids) - ANCHOR + 1):
                anchor = (owner, segment.ids[pos:pos + ANCHOR])
                pool.anchors.setdefault(anchor, []).append((segment, pos))
            while pool.bytes > pool.max_bytes:
                self._drop(next(iter(pool.segments.values())))

    def _drop(self, segment: Segment) -> None:
        pool = self._pool
        del pool.segments[id(segment)]
        pool.bytes -= segment.nbytes
        for pos in range(len(segment.ids) - ANCHOR + 1):
            anchor = (segment.owner, segment.ids[pos:pos + ANCHOR])
            places = [p for p in pool.anchors.get(anchor, ()) if p[0] is not segment]
            if places:
                pool.anchors[anchor] = places
            else:
                pool.anchors.pop(anchor, None)

    # ---- find ------------------------------------------------------------------------------

    def find(self, ids: Sequence[int], limit: int) -> tuple[Segment, int, int] | None:
        """The longest run of a kept segment that ``ids`` begin with, at most ``limit`` ids:
        (segment, where the run starts in it, its length); None when shorter than
        ``min_tokens``."""
        if limit < self.min_tokens:
            return None
        ids = tuple(ids[:limit])
        best: tuple[Segment, int, int] | None = None
        owner, pool = self.owner(), self._pool
        with pool.lock:
            places = pool.anchors.get((owner, ids[:ANCHOR]), [])[-CANDIDATES:]
            for segment, pos in reversed(places):
                n = _common(ids, segment.ids, pos) if segment.owner == owner else 0
                if n >= self.min_tokens and (best is None or n > best[2]):
                    best = (segment, pos, n)
            if best is not None:
                pool.segments.move_to_end(id(best[0]))
        return best

    def split(self, layout: PromptLayout) -> tuple[PromptLayout, HistoryRows | None]:
        """``layout`` with the run of history its suffix begins with as one more chunk (the
        same ids at the same positions; the last suffix token stays computed), and that
        chunk's rows; ``layout`` itself and None when no run is kept."""
        suffix = layout.suffix_ids
        found = self.find(suffix, len(suffix) - 1)
        if found is None:
            return layout, None
        segment, pos, n = found
        kv = ChunkKV(segment.k[:, :, pos:pos + n], segment.v[:, :, pos:pos + n], suffix[:n],
                     context_tag=HISTORY_TAG)
        split = PromptLayout(layout.prefix_ids, [*layout.chunk_ids, suffix[:n]], suffix[n:],
                             layout.chunk_prefix_ids)
        return split, HistoryRows(layout.suffix_start, kv)


def _no_namespace() -> str:
    return ""


def _common(ids: tuple[int, ...], other: tuple[int, ...], pos: int) -> int:
    """How many of ``ids`` equal ``other[pos:]``'s, from the first."""
    n = 0
    for a, b in zip(ids, other[pos:]):
        if a != b:
            break
        n += 1
    return n


def _unrotate(k: torch.Tensor, rope: RopeTables, start: int) -> torch.Tensor:
    """k: [layers, kv_heads, T, D] rotated at positions [start, start + T) -> pre-RoPE keys (in
    float32, rounded once to k's dtype)."""
    out = torch.empty_like(k)
    span = slice(start, start + k.shape[2])
    for layer in range(k.shape[0]):
        out[layer] = rope.layer(layer).at(span).unrotate(k[layer])
    return out
