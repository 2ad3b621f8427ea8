"""A request's prefill as steps: a generator that stops at each of its passes over the cached
rows (the preview pass, the main pass), hands the pass (``CachedPass``) to whoever runs it and
takes back its ``LoopResult``. ``run_alone`` runs each pass by itself (a request alone); a
scheduler may run several requests' passes as one forward (engine/request/packing.py)."""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.loop import LoopPlan, LoopResult
from blendrag.engine.compute.observers import LayerObserver, PhaseClock
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.request.stats import RequestStats
from blendrag.model.rope import RopeTables


@dataclass
class CachedPass:
    """A pass of a request over its cached rows (its main pass, or the preview pass), handed to
    whoever runs it: ``runner.run`` alone (``run_alone``), or packed into one forward with
    other requests' (engine/request/packing.py). Its runner sets ``packed`` (the requests of
    its forward) and ``pass_s`` (the forward's seconds)."""

    plan: LoopPlan
    fused: FusedKV
    rope: RopeTables
    observers: tuple[LayerObserver, ...]
    clock: PhaseClock
    pieces: PrefillPieces | None
    alone: bool = False  # run it alone (the preview pass of a timed request)
    packed: int = 1
    pass_s: float = 0.0


T = TypeVar("T")
Steps = Generator[CachedPass, LoopResult, T]
"""A request's work up to its result, stopping at each of its passes: it yields the pass and
takes its ``LoopResult`` (or has the pass's error thrown in), and returns the result."""


def stop_at(cached: CachedPass, stats: RequestStats) -> Steps[LoopResult]:
    """Stop at ``cached`` for whoever runs it -> its result; the time it waited there for the
    requests run with it goes to ``stats.timing.waited_s``, a warming pass to
    ``stats.compute.warming_passes``."""
    t0 = time.perf_counter()
    out = yield cached
    stats.timing.waited_s += max(time.perf_counter() - t0 - cached.pass_s, 0.0)
    stats.compute.warming_passes += out.warming
    return out


def run_alone(runner: ModelRunner, steps: Steps[T]) -> T:
    """Drive ``steps``, running each of its passes alone -> its result."""
    try:
        cached = next(steps)
        while True:
            t0 = time.perf_counter()
            try:
                out = runner.run(cached.plan, cached.fused, cached.rope, cached.observers,
                                 cached.clock, cached.pieces)
            except Exception as exc:  # the request's to handle (a layer that failed to load)
                cached = steps.throw(exc)
            else:
                cached.pass_s = time.perf_counter() - t0
                cached = steps.send(out)
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()
