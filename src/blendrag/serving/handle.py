"""A request served by the scheduler, as its caller holds it: the text deltas as they come
(iterated from a thread, or ``async for`` on an event loop without a thread of its own), the
result once done, and ``cancel()``.

The scheduler's thread puts each step's deltas here; a waiting thread is woken by a condition,
a waiting coroutine by its event loop (``call_soon_threadsafe``), so thousands of waiting
coroutines cost no thread each.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator

from blendrag.engine import GenerationResult
from blendrag.engine.request.prefill import Prefill
from blendrag.serving.errors import RequestCancelled

_DONE = object()


class ServedRequest:
    """One request's side of the scheduler. Iterate it (or ``async for``) for its text deltas;
    ``result`` is the ``GenerationResult`` once they are all out (``wait``/``wait_async``
    block until then); an error the request met is raised where its deltas are read. An
    iterator closed or dropped before the request is done (a ``break``, a client gone) cancels
    it: keep the iterator to read on, or ``wait`` for the rest."""

    def __init__(self) -> None:
        self.result: GenerationResult | None = None
        self.prefill: Prefill | None = None  # set once the scheduler has prefilled it
        # seconds from its arrival until the scheduler admitted it (a slot and pool blocks
        # free): the queueing part of its time to first token; None while it waits
        self.queued_s: float | None = None
        self.error: BaseException | None = None
        self._items: deque[object] = deque()
        self._cond = threading.Condition()
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self._cancelled = False
        self._closed = False

    # ---- the scheduler's side ----------------------------------------------------------------

    def put(self, deltas: list[str]) -> None:
        """Hand out ``deltas`` (the scheduler's thread)."""
        if deltas:
            self._push(*deltas)

    def finish(self, result: GenerationResult) -> None:
        self._push(_DONE, result=result)

    def fail(self, error: BaseException) -> None:
        """End the request with ``error`` (nothing, when it is done already)."""
        self._push(_DONE, error=error)

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def done(self) -> bool:
        return self._closed

    def _push(self, *items: object, result: GenerationResult | None = None,
              error: BaseException | None = None) -> None:
        with self._cond:
            if self._closed:
                return
            self.result = result if result is not None else self.result
            self.error = error
            self._items.extend(items)
            self._closed = items[-1] is _DONE
            self._cond.notify_all()
            wakers = list(self._wakers)
        for loop, event in wakers:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the caller's loop is closed: nobody is waiting there
                pass

    # ---- the caller's side -------------------------------------------------------------------

    def cancel(self) -> None:
        """Stop the request: the scheduler frees its slot and pool blocks at its next step, and
        reading it raises ``RequestCancelled``."""
        if not self._closed:
            self._cancelled = True
            self.fail(RequestCancelled("the request was cancelled"))

    def __iter__(self) -> Iterator[str]:
        try:
            while True:
                with self._cond:
                    while not self._items:
                        self._cond.wait()
                    item = self._items.popleft()
                if item is _DONE:
                    self._raise()
                    return
                yield item  # type: ignore[misc]
        except GeneratorExit:  # closed or dropped before its end: free what the request holds
            if not self._closed:
                self.cancel()
            raise

    async def __aiter__(self) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._cond:
            self._wakers.append((loop, event))
        try:
            while True:
                with self._cond:
                    item = self._items.popleft() if self._items else None
                    if item is None:
                        event.clear()
                if item is None:
                    await event.wait()
                    continue
                if item is _DONE:
                    self._raise()
                    return
                yield item  # type: ignore[misc]
        except (asyncio.CancelledError, GeneratorExit):
            if not self._closed:  # the caller went away: free what the request holds
                self.cancel()
            raise
        finally:
            with self._cond:
                self._wakers.remove((loop, event))

    def wait(self, timeout: float | None = None) -> GenerationResult:
        """Block until the request is done -> its result (or raise its error)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed, timeout):
                raise TimeoutError(f"the request was not done within {timeout} s")
        return self._outcome()

    async def wait_async(self) -> GenerationResult:
        """``wait`` for an event loop: the deltas are drained, the result returned."""
        async for _ in self:
            pass
        return self._outcome()

    def _outcome(self) -> GenerationResult:
        self._raise()
        if self.result is None:
            raise RuntimeError("the request ended without a result")
        return self.result

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error
