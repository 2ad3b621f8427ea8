"""Plain reads of a number of bytes from each storage device, the yardsticks of the store bench:
a memcpy (RAM), a sequential file read (disk, page cache dropped), a Redis GET.

Also page-cache control for the disk figures: ``drop_page_cache`` (fsync + fadvise DONTNEED,
no root needed for clean pages) and ``resident_fraction`` (mincore) to check that it worked.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import torch


def memcpy_seconds(dst: torch.Tensor, src: torch.Tensor) -> float:
    """Seconds of one ``memcpy`` of ``src`` into ``dst`` (allocate and touch both beforehand)."""
    t0 = time.perf_counter()
    copy_bytes(dst, src)
    return time.perf_counter() - t0


def copy_bytes(dst: torch.Tensor, src: torch.Tensor, offset: int = 0) -> None:
    """memcpy of ``src``'s bytes into ``dst`` at byte ``offset`` (both contiguous host tensors).

    One plain single-threaded copy, where ``Tensor.copy_`` may fan out to threads, which makes
    its speed depend on what else runs on the machine."""
    n = src.numel() * src.element_size()
    if (
        not (src.is_contiguous() and dst.is_contiguous())
        or offset + n > dst.numel() * dst.element_size()
    ):
        raise ValueError("copy_bytes needs contiguous tensors and room in dst")
    ctypes.memmove(dst.data_ptr() + offset, src.data_ptr(), n)


def file_read_seconds(path: Path) -> float:
    """Seconds of a plain ``open(path, "rb").read()`` of the whole file."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        data = f.read()
    seconds = time.perf_counter() - t0
    del data
    return seconds


def redis_get_seconds(client, name: str) -> float:
    """Seconds of one plain GET of ``name``."""
    t0 = time.perf_counter()
    data = client.get(name)
    seconds = time.perf_counter() - t0
    if data is None:
        raise KeyError(name)
    return seconds


def drop_page_cache(path: Path) -> bool:
    """Write the file back and evict it from the page cache; True when none of it stays resident."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (OSError, AttributeError):
        return False
    finally:
        os.close(fd)
    return resident_fraction(path) == 0.0


def resident_fraction(path: Path) -> float | None:
    """Fraction of the file's pages in the page cache (mincore), None where it cannot be told."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private map: no write-back
    except (OSError, ValueError):
        return None
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
    finally:
        del anchor  # the buffer export must end before the map closes
        mm.close()
    return None if rc != 0 else sum(v & 1 for v in vec) / pages
