"""A scheduler's prefill workers: threads that prefill the requests it admits beside its
decoding loop (``ServingConfig.prefill_workers``), and the admitted requests none has taken yet.

A worker takes every waiting request at once when they are to be packed into shared forwards,
else one at a time, so that the decoding loop, idle on a CPU, may take another (``take``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from blendrag.serving.jobs import Job


class PrefillWorkers:
    """``count`` threads, each running ``prefill(jobs)`` on the requests it takes;
    ``together()``: whether a worker takes every waiting request at once. ``cond`` is the
    scheduler's lock, which guards the waiting requests."""

    def __init__(self, count: int, cond: threading.Condition,
                 prefill: Callable[[list[Job]], None], together: Callable[[], bool]) -> None:
        if count < 1:
            raise ValueError(f"prefill workers need at least one thread, got {count}")
        self.count = count
        self._cond, self._prefill, self._together = cond, prefill, together
        self._waiting: deque[Job] = deque()  # handed over, no worker has taken them yet
        self._threads: ThreadPoolExecutor | None = None

    def hand(self, jobs: list[Job]) -> None:
        """Have ``jobs`` prefilled by the next free worker."""
        with self._cond:
            self._waiting.extend(jobs)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.count, thread_name_prefix="blendrag-prefill")
        self._threads.submit(self._task)

    def take(self) -> Job | None:
        """The latest request no worker has taken, for the caller to prefill; the caller holds
        ``cond``."""
        return self._waiting.pop() if self._waiting else None

    def drop(self) -> list[Job]:
        """The requests no worker has taken, taken from them (none will be); the caller holds
        ``cond``."""
        jobs = list(self._waiting)
        self._waiting.clear()
        return jobs

    def shutdown(self) -> None:
        """Wait for the workers' prefills in flight, and stop the threads."""
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    def _task(self) -> None:
        """A worker's task: the requests no thread has taken yet, every one at once or one at a
        time (``together``)."""
        while True:
            with self._cond:
                take = len(self._waiting) if self._together() else 1
                jobs = [self._waiting.popleft() for _ in range(min(take, len(self._waiting)))]
            if not jobs:  # none left, or an earlier task took them
                return
            self._prefill(jobs)
