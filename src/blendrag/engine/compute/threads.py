"""The engine's CPU threads: torch's intra-op thread count, set for the engine's own calls only.

Why an engine sets threads at all: torch starts one intra-op thread per core, and its threads
spin-wait for each other at every operator. On a small CPU that other processes share (the
machines blendrag is most often tried on), a busy core stalls every operator: with one core
held by another process, precompute ran 3.8x faster on one thread than on two, while on a quiet
machine two threads were 1.5-1.6x faster (docs/benchmarks.md, "CPU threads"). One thread is
the default because its worst case measured is the smaller.

Why scoped rather than global: ``torch.set_num_threads`` is process-wide, and a library that
changes it for good changes the speed of everything else the user runs. The engine sets its
count when one of its calls starts and puts the previous count back when it returns (the
switch itself costs well under a microsecond); ``threads=None`` leaves torch's setting alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from blendrag.config import DEFAULT_THREADS

__all__ = ["DEFAULT_THREADS", "check_threads", "torch_threads"]


def check_threads(threads: int | None) -> int | None:
    """``threads`` if it is None or a count >= 1; else ValueError."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise ValueError(f"threads must be a count >= 1, or None to leave torch's setting "
                         f"(torch.set_num_threads) as it is; got {threads!r}")
    return threads


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads, then restore the previous count;
    ``None``: change nothing."""
    if threads is None or threads == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
