"""What one request is, as records: ``Request``, what it asked and what it keeps across its
attempts, and ``Parts``, the engine's collaborators it runs on. The prefill
(engine/request/prefill.py) and the choice of its mode (engine/request/mode.py) read and fill
them; neither imports the other for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from blendrag.config import BlendConfig
from blendrag.engine.caches.chunk_cache import ChunkCache
from blendrag.engine.caches.history import HistoryCache, HistoryRows
from blendrag.engine.caches.prefix_cache import PrefixCache
from blendrag.engine.compute.observers import LayerObserver
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.request.stats import ModeChoice, RequestStats
from blendrag.engine.selection.controller import LoadingController
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.prompt import PromptLayout


@dataclass(frozen=True)
class Parts:
    """What a request runs on: the engine's collaborators."""

    cache: ChunkCache
    runner: ModelRunner
    controller: LoadingController
    prefix_cache: PrefixCache | None = None
    history: HistoryCache | None = None


@dataclass
class Request:
    """One request from open to logits: what it was asked, what it keeps across attempts.

    ``layout`` (length-checked; once opened, with the history cache's chunk when one was
    found), ``config`` (once chosen: the mode and ratio it runs), ``capacity`` rows of KV,
    ``started`` (``time.perf_counter()`` when it arrived: its TTFT starts there), ``observers``
    of the main pass (a ``PhaseClock`` among them times every phase), ``pieces`` (a long main
    pass run in pieces, others' work between them: engine/compute/pieces.py), ``as_asked``
    (run ``config``'s own mode: no full prefill chosen instead, for a comparison of modes).
    Across attempts:
    ``history`` (the earlier turn's rows of its history chunk), ``failed`` (keys whose entry
    failed to load, with the KV computed for each), ``choice`` (the cost profile's record, or
    the record of a full prefill run because its chunks were missing; None when not asked),
    ``backfilled`` (its missing pieces queued); ``stats``: the current attempt's."""

    layout: PromptLayout
    config: BlendConfig
    capacity: int
    started: float
    observers: Sequence[LayerObserver] = ()
    pieces: PrefillPieces | None = None
    as_asked: bool = False
    history: HistoryRows | None = None
    failed: dict[str, ChunkKV | None] = field(default_factory=dict)
    choice: ModeChoice | None = None
    backfilled: int = 0  # missing pieces queued to be computed off its path
    stats: RequestStats = field(default_factory=partial(RequestStats, mode="full"))
