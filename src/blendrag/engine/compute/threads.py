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

Why one thread only on a CPU (``threads="auto"``, the default): an engine on a GPU computes on
the device, and its CPU work is host copies, above all cached rows from the RAM tier staged in
page-locked memory for the device (engine/compute/cuda_stager.py), a copy that torch spreads
over its threads. Threads the engine's calls start (the layer feed's reader) take the count in
effect, so one thread there would copy on one core what the GPU check measured on all of them
(its engines run with torch's own count). "auto" is one thread on a CPU and torch's own count
on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from blendrag.config import AUTO, DEFAULT_THREADS, threads_valid

__all__ = ["DEFAULT_THREADS", "check_threads", "engine_threads", "torch_threads"]


def check_threads(threads: int | str | None) -> int | str | None:
    """``threads`` if it is None, "auto" or a count >= 1; else ValueError."""
    if not threads_valid(threads):
        raise ValueError(f"threads must be a count >= 1, or None to leave torch's setting "
                         f"(torch.set_num_threads) as it is, or \"auto\" (one on a CPU, "
                         f"torch's own on a GPU); got {threads!r}")
    return threads


def engine_threads(threads: int | str | None, device: torch.device) -> int | None:
    """The count an engine on ``device`` runs its calls with: ``threads`` as given (checked);
    "auto": ``DEFAULT_THREADS`` on a CPU, None (torch's own) on any other device (module
    docstring)."""
    threads = check_threads(threads)
    if threads == AUTO:
        return DEFAULT_THREADS if device.type == "cpu" else None
    return None if threads is None else int(threads)


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
