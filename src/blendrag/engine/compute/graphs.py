"""Capturing a step of fixed shape as a CUDA graph: the decoding step (decode.py) and the
static passes (static_pass.py) capture the same way.

The step is run twice first on a side stream (kernels compiled, libraries' workspaces set
up outside the capture), then captured on it. One capture at a time in the process (a lock):
a decoding step and a pass captured at once from two threads (serving's decoding loop and its
prefill worker) would allocate from the caching allocator's capture pools side by side. The
capture is ``thread_local``: work that other threads launch meanwhile (the backfill computing
chunks, a layer feed's reader copying rows) is theirs, not the capture's to refuse.

Graphs that share a memory pool capture through a ``SharedPool``: the caching allocator keeps
a pool whose graphs are all gone while a tensor allocated in it during a capture still lives,
and then refuses any capture into it (torch 2.11 on an H200: ``use_count > 0 INTERNAL ASSERT
FAILED``, after the static passes dropped a buffer's graphs), so a pool is shared only while
one of its graphs is alive.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from blendrag.kv.locked import CONTEXT_CALLS

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

_CAPTURING = CONTEXT_CALLS  # one capture at a time, and none beside host registrations
_STREAMS: dict[int, torch.cuda.Stream] = {}  # the capture stream of each device (by index)


def _capture_stream() -> torch.cuda.Stream:
    """The current device's capture stream, one for the life of the process (the caller holds
    ``_CAPTURING``): graphs that share a memory pool are captured on one stream, since the
    caching allocator hands a pool's freed block only to a later allocation on the stream that
    freed it; and of high priority, so that it comes from torch's other pool of streams and is
    never the stream a layer feed or the device tier took from the default one (work another
    thread queued on it would land in the graph)."""
    index = torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(index, priority=-1)
    return _STREAMS[index]


def capture(step: Callable[[], torch.Tensor], device: torch.device,
            pool: _POOL_HANDLE | None = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``step`` captured as a CUDA graph on ``device`` (its memory from ``pool`` when given,
    shared with the graphs captured into it), and the tensor it returns, which every replay
    refills. ``step`` must read no value back to the host.

    The capture runs under ``device``, on its capture stream (``_capture_stream``; torch's
    default capture stream belongs to the thread's current device, which need not be the
    model's), and the thread's stream is the one it had afterwards, the capture failed or not:
    ``torch.cuda.graph`` leaves a failed capture's stream current, and the eager fallback would
    then run unordered with the other threads' work."""
    with _CAPTURING, torch.cuda.device(device):
        before = torch.cuda.current_stream(device)
        stream = _capture_stream()
        stream.wait_stream(before)
        try:
            with torch.cuda.stream(stream):  # warm-up: outside the capture
                for _ in range(2):
                    step()
            before.wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream,
                                  capture_error_mode="thread_local"):
                out = step()
            return graph, out
        finally:
            torch.cuda.set_stream(before)


class SharedPool:
    """One memory pool for the graphs captured through it, as long as one of them is alive;
    a new pool once they are all gone (see the module's docstring)."""

    def __init__(self) -> None:
        self._handle: _POOL_HANDLE | None = None
        self._graphs: weakref.WeakSet[torch.cuda.CUDAGraph] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.pools = 0  # pools taken so far (the tests count them)

    def capture(self, step: Callable[[], torch.Tensor],
                device: torch.device) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``step`` captured (``capture``) into the pool of the graphs alive, or a new one."""
        with self._lock:
            if not self._graphs:  # none alive (or none yet): a new pool
                self._handle = torch.cuda.graph_pool_handle()
                self.pools += 1
            graph, out = capture(step, device, self._handle)
            self._graphs.add(graph)
            return graph, out
