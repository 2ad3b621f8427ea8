"""Peak memory of one call beyond what was already allocated (the weights, the store, the
engine's pooled KV buffers).

CUDA: the caching allocator's peak counter. CPU: the process's peak RSS (VmHWM), reset before
the call through /proc/self/clear_refs. glibc's allocator decides whether RSS can show a call's
memory, so a benchmark switches it between two settings (both process-wide, fixed values, so
that every run of a multi-run benchmark measures under the same ones):

- ``memory_mode``: large blocks (>= 256 KiB) are mmapped and returned on free, so RSS follows
  live tensors. ``peak_bytes`` also hands the free heap's pages back before each call: else
  memory freed by earlier calls serves the measured call's tensors from pages already resident
  and its peak reads low, down to 0.
- ``timing_mode``: blocks below 32 MiB (where glibc's own adaptive threshold ends up) come from
  the heap and are reused, as in an untuned process. Under ``memory_mode`` every large
  temporary is a fresh mmap that page-faults on first touch, which cost up to a third of
  blend's TTFT on this CPU.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc: peaks stay upper bounds, timing unchanged
        return None


def memory_mode() -> None:
    """Make RSS follow live tensors (before measuring peaks): see the module docstring."""
    if (libc := _libc()) is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 1024 * 1024)


def timing_mode() -> None:
    """Let large temporaries be reused from the heap (before timing): see the module docstring."""
    if (libc := _libc()) is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)


def _release_free_heap() -> None:
    # free heap chunks hand their pages back (madvise), so reusing them faults pages in again
    # and shows in RSS
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Extra bytes at the peak of ``fn()`` over the memory in use before it."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        result = fn()
        torch.cuda.synchronize(device)
        del result
        return torch.cuda.max_memory_allocated(device) - base
    _release_free_heap()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _rss_kib("VmRSS")
    result = fn()
    peak = _rss_kib("VmHWM")
    del result
    return max(0, peak - base) * 1024
