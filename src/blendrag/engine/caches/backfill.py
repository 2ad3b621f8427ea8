"""Backfill: the chunks a request found in no store, computed and stored off its path.

The first question on new documents finds none of its passages stored. Computing their KVs
before the prefill (each chunk after its chunk prefix, and again after every filler of the
ingestion context) took 4.7-7.5x a full prefill on the default model, where a full prefill of
the same prompt is exact and needs none of them. So a request whose chunks are mostly missing
runs as a full prefill (``LoadingConfig.full_when_missing``, engine/request/prefill.py) and
hands the missing pieces here: one worker thread per engine computes and stores them
(``ChunkCache.kv``: looked up again first, so a piece another request stored meanwhile costs
nothing), and the next request over those passages hits them.

Each job carries the chunk cache it came from, so a namespace view's pieces land in that
namespace. The queue is bounded (``capacity``): a piece that does not fit is dropped, and the
next request that misses it queues it again. A piece already queued is not queued twice. A
failure to compute or store a piece is logged and counted, never raised into a request. The
worker ends when the queue is empty and the next ``submit`` starts another: an engine that is
dropped leaves no idle thread behind (nor one holding its model).
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from blendrag.engine.caches.context import ChunkContext

log = logging.getLogger(__name__)

CAPACITY = 1024  # pieces waiting or being computed at most


class Computes(Protocol):
    """What computes a piece: ``ChunkCache.kv`` (looked up, else computed and stored)."""

    def kv(self, chunk_prefix_ids: Sequence[int], chunk_ids: Sequence[int],
           context: ChunkContext | None = None, exact: bool = False) -> object: ...


@dataclass(frozen=True)
class Piece:
    """A prefix or a chunk to compute: its ids, the ids it is computed after, its context."""

    chunk_prefix_ids: tuple[int, ...]
    ids: tuple[int, ...]
    context: ChunkContext
    key: str  # its store key, for de-duplication
    exact: bool = False  # stored in the model's dtype (a prefix, prefix mode's chunk)
    prefix: bool = False  # the request's prefix (not one of its chunks)


class Backfill:
    """One worker thread computing queued pieces in order (started by a ``submit`` that finds
    none running, ended when the queue is empty)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"backfill capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._jobs: deque[tuple[Computes, Piece]] = deque()
        self._queued: set[tuple[int, str]] = set()  # (cache id, key) queued or being computed
        self._cond = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.computed = self.dropped = self.failed = 0
        self.warned = False  # a request handing it pieces said so at WARNING (prefill.py)
        _LIVE.add(self)

    def submit(self, cache: Computes, pieces: Sequence[Piece]) -> int:
        """Queue ``pieces`` of ``cache``; how many were queued (not already queued, room
        left)."""
        queued = 0
        with self._cond:
            if self._closed:
                return 0
            for piece in pieces:
                tag = (id(cache), piece.key)
                if tag in self._queued:
                    continue
                if len(self._jobs) + self._busy >= self.capacity:
                    self.dropped += 1
                    continue
                self._jobs.append((cache, piece))
                self._queued.add(tag)
                queued += 1
            if queued and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="blendrag-backfill",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return queued

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or being computed; False on ``timeout``."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def cancel(self, timeout: float = 30.0) -> bool:
        """Drop the pieces queued and wait (at most ``timeout``) for the one being computed;
        later pieces are taken as before (the next request that misses a dropped one queues it
        again). False on ``timeout``."""
        with self._cond:
            self.dropped += len(self._jobs)
            for cache, piece in self._jobs:
                self._queued.discard((id(cache), piece.key))
            self._jobs.clear()
            self._cond.notify_all()
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Take no more pieces, drop those queued and wait (at most ``timeout``) for the one
        being computed: a thread inside torch when the interpreter exits aborts the process."""
        with self._cond:
            self._closed = True
        self.cancel(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed or not self._jobs:  # the next submit starts another
                    self._thread = None
                    return
                cache, piece = self._jobs.popleft()
                self._busy += 1
            try:
                cache.kv(piece.chunk_prefix_ids, piece.ids, piece.context, exact=piece.exact)
                self.computed += 1
            except Exception as exc:  # a store or a model failure: the next request retries
                self.failed += 1
                log.warning("backfill: a chunk of %d tokens could not be computed and stored "
                            "(%s: %s); the next request over it computes it", len(piece.ids),
                            type(exc).__name__, exc)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._queued.discard((id(cache), piece.key))
                    self._cond.notify_all()


_LIVE: weakref.WeakSet[Backfill] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Stop every backfill worker before the interpreter finalizes (see ``Backfill.close``)."""
    for backfill in list(_LIVE):
        backfill.close()
