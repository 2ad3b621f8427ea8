"""Several requests' prefills at once, their passes packed into one forward.

Each request runs as steps (engine/request/steps.py ``Steps``): it opens its cached rows,
plans, and stops at each pass it runs over them: the preview pass (the default selector's),
then its main pass. Once every request of the group has stopped, the passes that pack
(``packable``: untimed, not long enough to run in pieces) run as one forward
(engine/compute/packed.py), up to ``max_tokens`` computed tokens together; each request then
takes its own result and goes on to its next pass or its logits. A pass that does not pack, or
is alone, runs as it would alone (``runner.run``: on a GPU a captured pass). A request whose
cached rows fail to load in a packed forward gets that error back and makes another attempt,
whose passes join a later round; nothing one request meets reaches another.

Exactness: each request's prefill is its prefill alone, except that a packed pass's projections
and MLP are rows of a larger matmul (engine/compute/packed.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TypeVar

from blendrag.engine.compute.loop import LoopResult
from blendrag.engine.compute.observers import OFF
from blendrag.engine.compute.packed import Lane
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.request.steps import CachedPass, Steps

T = TypeVar("T")


def run_together(runner: ModelRunner, steps: Sequence[Steps[T]], max_tokens: int,
                 on_result: Callable[[int, T | BaseException], None] | None = None,
                 ) -> list[T | BaseException]:
    """Drive every request's ``steps`` to its result, packing their passes into forwards of at
    most ``max_tokens`` computed tokens -> per request, its result or its error.
    ``on_result(j, outcome)``: called as soon as request j has it (a request whose pass ran in
    the first forward need not wait for a later one)."""
    done: dict[int, T | BaseException] = {}
    waiting: dict[int, CachedPass] = {}  # requests stopped at a pass

    def advance(j: int, step: Callable[[], CachedPass]) -> None:
        try:
            waiting[j] = step()
        except StopIteration as stop:
            done[j] = stop.value
        except Exception as exc:  # the request's own error, handed to its caller
            done[j] = exc
        if j in done and on_result is not None:
            on_result(j, done[j])

    try:
        for j, s in enumerate(steps):
            advance(j, s.__next__)
        while waiting:
            group = _group(waiting, max_tokens)
            mains = [waiting.pop(j) for j in group]
            for j, out in zip(group, _run_group(runner, mains)):
                if isinstance(out, BaseException):
                    advance(j, partial(steps[j].throw, out))
                else:
                    advance(j, partial(steps[j].send, out))
    finally:
        for s in steps:  # a request left mid-way (an interrupt) lets go of what it holds
            s.close()
    return [done[j] for j in range(len(steps))]


def packable(main: CachedPass) -> bool:
    """Whether ``main`` may run packed with other requests' passes."""
    if main.alone or main.clock is not OFF:
        return False
    return main.pieces is None or main.pieces.spans(main.plan, main.observers) is None


def _group(waiting: dict[int, CachedPass], max_tokens: int) -> list[int]:
    """The requests whose passes run next: the packable ones in order while their computed
    tokens fit ``max_tokens`` (at least one); else the first request alone."""
    group: list[int] = []
    tokens = 0
    for j, main in waiting.items():
        if not packable(main):
            continue
        a = main.plan.active.shape[0]
        if group and tokens + a > max_tokens:
            break
        group.append(j)
        tokens += a
    return group if len(group) >= 2 else [next(iter(waiting))]


def _run_group(runner: ModelRunner, mains: list[CachedPass]) -> list[LoopResult | BaseException]:
    """One pass alone (as ``run_alone`` runs it), or several packed into one forward."""
    t0 = time.perf_counter()
    out: list[LoopResult | BaseException]
    if len(mains) == 1:
        m = mains[0]
        try:
            out = [runner.run(m.plan, m.fused, m.rope, m.observers, m.clock, m.pieces)]
        except Exception as exc:
            out = [exc]
    else:
        lanes = [Lane(m.plan, m.fused, m.rope, m.observers) for m in mains]
        try:
            out = runner.run_packed(lanes)
        except Exception as exc:  # the shared arithmetic failed: every request's error
            out = [exc] * len(mains)
    for m in mains:
        m.packed, m.pass_s = len(mains), time.perf_counter() - t0
    return out
