"""Host memory that stored entries are read into (store/layered.py): page-locked when this
process uses CUDA (torch's pinned allocator hands freed blocks out again, already mapped, and
pinned memory is what a copy to the device wants), else pageable memory advised for huge pages
(fresh pageable memory faults in 4 KiB at a time during a read, about 2 GB/s; 2 MiB pages
fault about 5 times faster)."""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable

import torch


def host_buffer(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized host tensor that entries are read into (module docstring): page-locked
    when this process has started CUDA (a process that never uses the GPU does not get a CUDA
    context from the store), else pageable, advised for huge pages when large."""
    if torch.cuda.is_initialized():
        try:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        except RuntimeError:  # no page-locked memory left: pageable memory reads the same
            pass
    return pageable_buffer(shape, dtype)


def pageable_buffer(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized pageable host tensor, its whole 2 MiB pages advised for huge pages when
    it is large: a fresh buffer is then faulted in 2 MiB at a time (about 5 times faster than
    4 KiB pages). The memory is torch's own, freed as any tensor's."""
    out = torch.empty(shape, dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if nbytes >= _HUGE_MIN_BYTES:
        _advise_huge(out.data_ptr(), nbytes)
    return out


# Buffers at least this large are advised for huge pages (2 MiB pages on x86-64 and arm64).
_HUGE_MIN_BYTES = 4 << 20
_HUGE_PAGE = 2 << 20
_madvise: Callable[[int, int, int], int] | None = None


def _advise_huge(address: int, nbytes: int) -> None:
    """madvise(MADV_HUGEPAGE) over the whole huge pages of [address, address + nbytes): Linux
    only, best effort (a kernel without transparent huge pages, or with them off, refuses)."""
    global _madvise
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None or not sys.platform.startswith("linux"):
        return
    start = -(-address // _HUGE_PAGE) * _HUGE_PAGE
    end = (address + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    if end <= start:
        return
    if _madvise is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).madvise
        except (OSError, AttributeError):
            return
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
        _madvise = fn
    _madvise(start, end - start, advice)  # advice only: a refusal changes nothing
