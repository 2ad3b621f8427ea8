"""The threads that read layers of entry files ahead (store/layered.py), shared by every entry:
one thread copies from the page cache at a few GB/s, so an entry whose reader takes concurrent
positioned reads has its layers read and verified by a small pool, lowest layer first across
the entries open at once (the order the layer loop asks in)."""

from __future__ import annotations

import atexit
import os
import threading

from blendrag.store.s3_ranges import FetchPool

# Threads that read layers of entry files ahead, shared by every entry (0: each layer is read
# by its caller, when asked for).
READ_AHEAD_WORKERS = min(4, os.cpu_count() or 1)
TASK_BYTES = 8 << 20  # an entry's layers (K and V) one task reads, about
MIN_TASKS = 8  # tasks an entry's layers are read in, at least: layer 0 comes early


def task_layers(num_layers: int, layer_nbytes: int) -> int:
    """Layers one read-ahead task reads: about ``TASK_BYTES``, in at least ``MIN_TASKS``
    tasks an entry (the loop needs layer 0 of every entry first)."""
    return max(1, min(TASK_BYTES // max(1, layer_nbytes), -(-num_layers // MIN_TASKS)))

_pool: FetchPool | None = None
_pool_lock = threading.Lock()
_exiting = False


def read_pool() -> FetchPool | None:
    """The threads that read layers ahead, started at the first use (None: reading ahead is
    off, or the interpreter is exiting)."""
    global _pool
    if READ_AHEAD_WORKERS <= 0 or _exiting:
        return None
    with _pool_lock:
        if _pool is None:
            _pool = FetchPool(READ_AHEAD_WORKERS, name="blendrag-read-ahead")
        return _pool


@atexit.register
def _stop_pool() -> None:
    """Stop the pool's threads before the interpreter finalizes: a daemon thread that frees a
    tensor then (its last reference) aborts the process. A read still queued is done by
    whoever asks for its layer."""
    global _pool, _exiting
    with _pool_lock:
        pool, _pool, _exiting = _pool, None, True
    if pool is not None:
        pool.close()
        pool.join(timeout=10.0)  # a read under way ends in far less; a hung disk: exit anyway


def _forget_pool() -> None:
    # a forked child has none of the parent's threads (and maybe a lock held by one of them)
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
