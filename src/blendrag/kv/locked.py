"""Page-locked host memory of an exact size for a chunk's rows, and the copies that read it.

What it is for: the RAM tier's entries on a machine whose engine runs on CUDA
(``store/tiered.py`` copies a computed chunk's rows here). A copy from page-locked memory to
the device is one DMA at the link's rate, queued without the host waiting. From pageable
memory the layer feed first copies the rows into a staging buffer on the host
(``engine/compute/cuda_stager.py``), and that copy set the rate: 18 GB/s for a 3k prompt's
384 MiB on an H200.

Why not torch's pinned allocator (``pin_memory``): it rounds every block up to a power of two
and keeps freed blocks locked for its own reuse, so a tier could lock up to twice its budget
and never give it back. Here each block is an anonymous mapping of the exact size (rounded up
to a page), registered with the CUDA runtime (``cudaHostRegister``) and counted by the tier as
any entry's bytes.

Lifetime: a block lives as long as any tensor over it (the tensors' storage holds it). A copy
that reads it asynchronously, host rows sent to the device, is noted with the event that
follows it (``note_reads``). When the block's last tensor goes, the block retires; ``release``
unregisters (through the runtime that registered it) and unmaps the retired blocks whose noted
copies have completed. It runs at every allocation and when a RAM store drops entries (delete,
clear, close), never in the destructor, because unregistering can wait for the device. A block
whose unregistering fails stays mapped: unmapping registered memory is undefined.

Where page-locked memory cannot be had (no CUDA, a container's locked-memory limit, a runtime
that refuses), ``locked_empty`` returns None and the caller takes pageable memory: the same
values, copied more slowly. After a refusal nothing is registered again until some block has
been released.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import math
import mmap
import os
import threading
import weakref
from collections.abc import Iterable
from typing import NamedTuple, Protocol

import torch

log = logging.getLogger(__name__)


class Runtime(Protocol):
    """What registering memory needs from the CUDA runtime (a fake one in the CPU tests)."""

    def register(self, ptr: int, nbytes: int) -> bool: ...

    def unregister(self, ptr: int) -> bool: ...


class Event(Protocol):
    def query(self) -> bool: ...


class _Block:
    """One registered mapping. Its memory is lent to numpy (``__array_interface__``), and
    from numpy to torch, so the tensors over it hold the block."""

    def __init__(self, mapping: mmap.mmap, ptr: int, runtime: Runtime,
                 registry: _Registry) -> None:
        self.mapping, self.ptr, self.nbytes = mapping, ptr, len(mapping)
        self.runtime, self.registry = runtime, registry
        self.reads: list[Event] = []  # the events after copies that read it
        self.__array_interface__ = {"shape": (self.nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}

    def __del__(self) -> None:
        self.registry.retire(self)


class _Retired(NamedTuple):
    ptr: int
    mapping: mmap.mmap
    runtime: Runtime
    reads: list[Event]


class _Registry:
    """The live blocks by address (a copy's source is found by its data pointer), the retired
    ones still to be released, and the runtimes that refused a registration (with the count of
    releases then: they are asked again once memory has been given back)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a block freed while it is held retires here too
        self.starts: list[int] = []
        self.blocks: dict[int, weakref.ref[_Block]] = {}
        self.retired: list[_Retired] = []
        self.kept: list[mmap.mmap] = []  # unregistering failed: never unmapped
        self.released = 0
        # runtime -> ``released`` at its refusal; weak: a dead runtime's entry goes with it (by
        # id, a new runtime at a dead one's address was taken for it and never asked)
        self.refused: weakref.WeakKeyDictionary[Runtime, int] = weakref.WeakKeyDictionary()

    def add(self, block: _Block) -> None:
        with self.lock:
            bisect.insort(self.starts, block.ptr)
            self.blocks[block.ptr] = weakref.ref(block)

    def block_of(self, t: torch.Tensor) -> _Block | None:
        """The live block ``t``'s memory lies in, or None."""
        if not self.starts or t.device.type != "cpu":
            return None
        ptr = t.data_ptr()
        with self.lock:
            i = bisect.bisect_right(self.starts, ptr) - 1
            if i < 0:
                return None
            block = self.blocks[self.starts[i]]()
        return block if block is not None and ptr < block.ptr + block.nbytes else None

    def note(self, block: _Block, event: Event) -> None:
        with self.lock:
            block.reads = [e for e in block.reads if not e.query()] + [event]

    def retire(self, block: _Block) -> None:
        """``block``'s last tensor is gone: kept (the mapping, not the block) until released."""
        with self.lock:
            if self.blocks.pop(block.ptr, None) is not None:
                self.starts.pop(bisect.bisect_left(self.starts, block.ptr))
            self.retired.append(_Retired(block.ptr, block.mapping, block.runtime, block.reads))

    def release(self) -> int:
        """Unregister and unmap the retired blocks whose noted copies have completed; how many
        are left (a copy from them still queued)."""
        done: list[_Retired] = []
        with self.lock:
            left: list[_Retired] = []
            for r in self.retired:
                (done if all(e.query() for e in r.reads) else left).append(r)
            self.retired = left
        for r in done:
            with CONTEXT_CALLS:
                unregistered = r.runtime.unregister(r.ptr)
            if unregistered:
                r.mapping.close()
                with self.lock:
                    self.released += 1
            else:
                with self.lock:
                    self.kept.append(r.mapping)
        return len(left)

    def refuses(self, runtime: Runtime) -> bool:
        """Whether ``runtime`` refused a registration and nothing was released since."""
        with self.lock:
            return self.refused.get(runtime) == self.released

    def refusal(self, runtime: Runtime) -> None:
        with self.lock:
            self.refused[runtime] = self.released


REGISTRY = _Registry()
CONTEXT_CALLS = threading.Lock()
"""Held around calls that act on the whole CUDA context (registering and unregistering host
memory) and by CUDA graph captures (engine/compute/graphs.py): such a call on one thread while
another captures may invalidate the capture, and a failed capture turns graphs off."""
HUGE_MIN_BYTES = 4 << 20  # blocks at least this large are advised for huge pages


def release() -> int:
    """Release the retired blocks whose copies are done (``_Registry.release``); how many
    retired blocks are left."""
    return REGISTRY.release()


class _Cudart:
    """The CUDA runtime torch uses. A refused call leaves its error as the thread's last
    error, which torch's next check after a kernel launch would raise, so it is cleared, in
    torch's own runtime library (found by its soname among those loaded: another package's
    runtime, loaded first, is not the one torch checks)."""

    PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA context

    def __init__(self) -> None:
        self.rt = torch.cuda.cudart()
        self.ok = self.rt.cudaError.success
        major = str(torch.version.cuda).split(".")[0]
        lib = ctypes.CDLL(f"libcudart.so.{major}", mode=os.RTLD_NOLOAD)  # OSError: not loaded
        self.clear = lib.cudaGetLastError

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.rt.cudaHostRegister(ptr, nbytes, self.PORTABLE) == self.ok:
            return True
        self.clear()
        return False

    def unregister(self, ptr: int) -> bool:
        if self.rt.cudaHostUnregister(ptr) == self.ok:
            return True
        self.clear()
        return False


_runtime: list[Runtime | None] = []  # made at the first allocation; [None]: none to be had


def runtime() -> Runtime | None:
    """The CUDA runtime's registration calls, or None (no CUDA, or a runtime whose last error
    cannot be cleared: no registration is then tried, and the RAM tier stays pageable)."""
    if not _runtime:
        try:
            _runtime.append(_Cudart() if torch.cuda.is_available() else None)
        except (AttributeError, OSError, RuntimeError) as exc:
            log.info("no page-locked RAM tier entries: CUDA's runtime library was not found "
                     "among those loaded (%s); they stay pageable", exc)
            _runtime.append(None)
    return _runtime[0]


def locked_empty(shape: tuple[int, ...], dtype: torch.dtype,
                 rt: Runtime | None = None) -> torch.Tensor | None:
    """An uninitialized host tensor in page-locked memory of its own (module docstring), or
    None when none can be had. ``rt``: the runtime to register with (default: CUDA's)."""
    rt = rt if rt is not None else runtime()
    nbytes = math.prod(shape) * dtype.itemsize
    if rt is None or nbytes == 0:
        return None
    REGISTRY.release()
    if REGISTRY.refuses(rt):
        return None
    mapping = _mapping(nbytes)
    if mapping is None:
        return None
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))  # (the export ends here)
    with CONTEXT_CALLS:
        registered = rt.register(ptr, len(mapping))
    if not registered:
        REGISTRY.refusal(rt)
        mapping.close()
        return None
    block = _Block(mapping, ptr, rt, REGISTRY)
    REGISTRY.add(block)
    try:
        import numpy  # a dependency of transformers; only needed here

        raw = torch.from_numpy(numpy.asarray(block))  # [pages] uint8, holding the block
        return raw[:nbytes].view(dtype).view(shape)
    except Exception as exc:  # never fail a put: the block retires now, released later
        log.warning("locked memory could not be lent to torch (%s); pageable instead",
                    str(exc))  # (not the exception: a kept record would hold the block)
        return None


def _mapping(nbytes: int) -> mmap.mmap | None:
    """A private anonymous mapping of ``nbytes`` rounded up to a page (private: a shared one
    follows shmem's huge-page setting, off by default), advised for huge pages when large;
    None when the system has no room for it."""
    try:
        mapping = mmap.mmap(-1, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE,
                            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return None
    if nbytes >= HUGE_MIN_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        try:  # registering faults every page in: 2 MiB pages fault about 5x faster
            mapping.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages: advice only
            pass
    return mapping


def is_locked(t: torch.Tensor) -> bool:
    """Whether ``t`` lies in a block from ``locked_empty``."""
    return REGISTRY.block_of(t) is not None


def note_reads(tensors: Iterable[torch.Tensor], event: Event) -> None:
    """Copies reading ``tensors`` were queued before ``event``: the locked blocks among them
    are not unmapped before it completes. Call it after every asynchronous copy from host
    rows that may be locked."""
    if not REGISTRY.starts:
        return
    for t in tensors:
        block = REGISTRY.block_of(t)
        if block is not None:
            REGISTRY.note(block, event)


def note_copies(tensors: Iterable[torch.Tensor], device: torch.device) -> None:
    """Copies reading ``tensors`` to ``device`` were just queued on its current stream: when
    any of them is locked, ``note_reads`` with an event recorded there now."""
    if device.type != "cuda" or not REGISTRY.starts:
        return
    blocks = [b for b in map(REGISTRY.block_of, tensors) if b is not None]
    if blocks:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(device))
        for block in blocks:
            REGISTRY.note(block, event)
