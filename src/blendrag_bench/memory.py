"""Peak memory of one call beyond what was already allocated (the weights, the store).

CUDA: the caching allocator's peak counter. CPU: the process's peak RSS (VmHWM), reset before
the call through /proc/self/clear_refs; glibc's mmap threshold is pinned so that large tensors
are mmapped and returned on free, so RSS follows live tensors instead of a grown heap. Pin
them only after timing: fresh mmaps page-fault on first touch, which costs up to a third of
blend's TTFT on this CPU.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def pin_malloc_thresholds() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 1024 * 1024)
    except OSError:  # not glibc: figures stay upper bounds
        pass


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
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _rss_kib("VmRSS")
    result = fn()
    peak = _rss_kib("VmHWM")
    del result
    return max(0, peak - base) * 1024
