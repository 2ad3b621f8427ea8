"""Capturing a step of fixed shape as a CUDA graph: the decoding step (decode.py) and the
static passes (static_pass.py) capture the same way.

The step is run twice first on a side stream (kernels compiled, libraries' workspaces set
up outside the capture), then captured on it. One capture at a time in the process (a lock):
a decoding step and a pass captured at once from two threads (serving's decoding loop and its
prefill worker) would allocate from the caching allocator's capture pools side by side. The
capture is ``thread_local``: work that other threads launch meanwhile (the backfill computing
chunks, a layer feed's reader copying rows) is theirs, not the capture's to refuse.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

_CAPTURING = threading.Lock()


def capture(step: Callable[[], torch.Tensor], device: torch.device,
            pool: _POOL_HANDLE | None = None) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``step`` captured as a CUDA graph on ``device`` (its memory from ``pool`` when given,
    shared with the graphs captured into it), and the tensor it returns, which every replay
    refills. ``step`` must read no value back to the host."""
    with _CAPTURING:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up: outside the capture
            for _ in range(2):
                step()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            out = step()
        return graph, out
