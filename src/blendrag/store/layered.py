"""Layer-wise reads of a stored chunk KV: the header at once, then one layer at a time.

A request's prefill asks for layer i of every cached chunk while it computes layer i - 1
(``engine/compute/layer_feed.py``), so a store hands out a ``LayeredEntry`` instead of a whole
``ChunkKV``: its header fields (token ids, prefix hash, context tag, shape, dtype) and its small
priors (profile, context shift) are read and verified when it is opened, and ``layer(i)``
reads and verifies only layer i. The integrity unit is the layer: each of ``k.{i}`` and
``v.{i}`` is checked against its own checksum from the (checksummed) header before it is
returned, so a defect in layer k is found when layer k is read, and layers before it, already
used, were verified.

A read that fails after the entry was opened (a checksum mismatch, a tier that went away)
raises ``LayerReadError``: the rows of that layer do not exist, so the request cannot go on
with this entry (``BlendEngine.prefill`` redoes the request with the chunk recomputed).

- ``MemoryLayeredEntry``: over a ``ChunkKV`` held in memory (RAM tier, a chunk computed by
  this request): ``layer(i)`` returns views, nothing is read.
- ``EncodedLayeredEntry``: over the codec's ``EntryReader`` (disk: positioned reads on the
  entry file; Redis: GETRANGE of the layer's byte ranges), each layer read into its slot of
  one stacked buffer, so that a fully read entry is a ``ChunkKV`` without another copy.

Reading speed (disk entries in the page cache): a layer is one ``preadv`` straight into the
stacked buffer plus one xxh3-128 pass over it (tens of GB/s), and two things decide the rate.
The buffer: fresh pageable memory faults in 4 KiB at a time during the read (about 2 GB/s,
slower than the copy itself), so it is page-locked memory when this process uses CUDA (torch's
pinned allocator hands freed blocks out again, already mapped, and pinned memory is what a
copy to the device wants) and otherwise memory advised for huge pages (``host_buffer``). And
one thread copies from the page cache at a few GB/s: an entry whose reader takes concurrent
positioned reads (an entry file) has its layers read and verified ahead by a small pool of
threads shared by every entry, lowest layer first across the entries open at once (the order
the layer loop asks in). ``layer(i)`` still returns only once layer i is read and verified, and
raises that read's error, as if it had read the layer itself; ``close`` drops the reads not
started and waits for those under way.
"""

from __future__ import annotations

import atexit
import ctypes
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from functools import partial
from typing import Protocol, runtime_checkable

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import EntryReader
from blendrag.store.s3_ranges import FetchPool

# Threads that read layers of entry files ahead, shared by every entry (0: each layer is read
# by its caller, when asked for).
READ_AHEAD_WORKERS = min(4, os.cpu_count() or 1)


class LayerReadError(RuntimeError):
    """Layer ``layer`` of the entry ``key`` could not be read or failed its checksum after the
    entry was opened. The entry is unusable for this request; the store has dropped it (when a
    fresh read of its stored bytes fails a check too) or counted the failure against the tier
    it came from (a storage failure)."""

    def __init__(self, key: str, layer: int, cause: BaseException | str) -> None:
        super().__init__(f"layer {layer} of entry {key[:16]}: {cause}")
        self.key = key
        self.layer = layer


@runtime_checkable
class LayeredEntry(Protocol):
    """A stored chunk KV opened for layer-wise reading (see the module docstring)."""

    key: str
    tier: str  # where the layers come from: "ram", "disk", "redis", ... or "computed"
    token_ids: tuple[int, ...]
    prefix_hash: str
    context_tag: str
    profile: torch.Tensor | None
    context_shift: torch.Tensor | None

    @property
    def shape(self) -> tuple[int, int, int, int]: ...  # [L, Hkv, T, D]
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def layer_nbytes(self) -> int: ...  # bytes of one layer's K and V, as read back
    @property
    def stored_layer_nbytes(self) -> int: ...  # the same layer where it is stored
    exact: bool  # the rows as computed (stored in the model's dtype)
    @property
    def complete(self) -> bool: ...  # every layer read already (materialize() costs nothing)
    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]: ...
    def materialize(self) -> ChunkKV: ...
    def close(self) -> None: ...


class _Shape:
    """Properties every layered entry derives from ``shape`` and ``dtype``."""

    shape: tuple[int, int, int, int]
    dtype: torch.dtype

    @property
    def num_tokens(self) -> int:
        return self.shape[2]

    @property
    def num_layers(self) -> int:
        return self.shape[0]

    @property
    def layer_nbytes(self) -> int:
        _, h, t, d = self.shape
        return 2 * h * t * d * self.dtype.itemsize

    @property
    def stored_layer_nbytes(self) -> int:
        """Bytes one layer takes where it is stored (what a read moves)."""
        return self.layer_nbytes

    exact = True  # whether the rows are as computed (not rounded to a smaller stored format)


class LayeredEntryWrapper:
    """``inner`` as it is; a subclass overrides the reads it changes (``layer``,
    ``materialize``, ``close``). The header fields are copied when it is made: they are fixed
    once an entry is open."""

    def __init__(self, inner: LayeredEntry) -> None:
        self.inner = inner
        self.key, self.tier, self.exact = inner.key, inner.tier, inner.exact
        self.token_ids, self.prefix_hash = inner.token_ids, inner.prefix_hash
        self.context_tag = inner.context_tag
        self.profile, self.context_shift = inner.profile, inner.context_shift

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.inner.shape  # [L, Hkv, T, D]

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def num_tokens(self) -> int:
        return self.inner.num_tokens

    @property
    def num_layers(self) -> int:
        return self.inner.num_layers

    @property
    def layer_nbytes(self) -> int:
        return self.inner.layer_nbytes

    @property
    def stored_layer_nbytes(self) -> int:
        return self.inner.stored_layer_nbytes

    @property
    def complete(self) -> bool:
        return self.inner.complete

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner.layer(i)  # each [Hkv, T, D]

    def materialize(self) -> ChunkKV:
        return self.inner.materialize()

    def close(self) -> None:
        self.inner.close()


def _four(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    layers, heads, tokens, dim = shape  # [L, Hkv, T, D]
    return layers, heads, tokens, dim


class MemoryLayeredEntry(_Shape):
    """A ``ChunkKV`` in memory as a layered entry: layers are views, reads cost nothing."""

    def __init__(self, kv: ChunkKV, key: str = "", tier: str = "ram") -> None:
        self.kv, self.key, self.tier = kv, key, tier
        self.token_ids, self.prefix_hash = kv.token_ids, kv.prefix_hash
        self.context_tag = kv.context_tag
        self.profile, self.context_shift = kv.profile, kv.context_shift
        self.shape = _four(tuple(kv.keys.shape))
        self.dtype = kv.keys.dtype

    complete = True  # nothing to read

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.keys[i], self.kv.values[i]  # [Hkv, T, D] views

    def materialize(self) -> ChunkKV:
        return self.kv

    def close(self) -> None:
        pass


class EncodedLayeredEntry(_Shape):
    """An encoded entry (disk, Redis) read layer by layer through an ``EntryReader``.

    ``layer(i)`` reads layer i into slot i of the stacked K and V ([L, Hkv, T, D], allocated
    at open: the same memory a whole-entry read takes) and verifies it; ``complete`` says
    whether every layer has been read, after which ``materialize`` is free. Raises
    ``EntryError`` or the tier's storage errors (the store turns them into
    ``LayerReadError``)."""

    def __init__(self, reader: EntryReader, key: str, tier: str) -> None:
        self._reader, self.key, self.tier = reader, key, tier
        self.token_ids, self.prefix_hash = reader.token_ids, reader.prefix_hash
        self.context_tag = reader.context_tag
        self.shape, self.dtype = _four(reader.shape), reader.dtype
        self.stored = reader.stored  # K and V as stored: the model's dtype, 16-bit or int8
        self.exact = self.stored == self.dtype
        self.profile, self.context_shift = reader.read_priors()
        self._keys = host_buffer(self.shape, self.dtype)
        self._values = host_buffer(self.shape, self.dtype)
        self._read = [False] * self.num_layers
        # layer -> its read by the shared pool (module docstring); taken back by ``layer``
        self._ahead: dict[int, Future] = {}
        pool = _read_pool() if reader.concurrent_reads else None
        if pool is not None:
            me = weakref.ref(self)  # a queued read keeps no entry (and no buffer) alive
            for i in range(self.num_layers):
                self._ahead[i] = pool.submit(i, partial(_read_ahead, me, i))

    @property
    def complete(self) -> bool:
        return all(self._read)

    @property
    def stored_layer_nbytes(self) -> int:
        _, h, t, d = self.shape
        scales = 4 * h * (d + t) if self.stored == torch.int8 else 0  # K per channel, V per token
        return 2 * h * t * d * self.stored.itemsize + scales

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._read[i]:
            ahead = self._ahead.pop(i, None)
            if ahead is not None and not ahead.cancel():
                ahead.result()  # read (or being read) by the pool: its error is this read's
            else:  # not started yet: read here rather than wait behind other layers
                self._read_layer(i)
            self._read[i] = True
        return self._keys[i], self._values[i]

    def _read_layer(self, i: int) -> None:
        self._reader.layer_into(i, self._keys[i], self._values[i])

    def materialize(self) -> ChunkKV:
        for i in range(self.num_layers):
            self.layer(i)
        return ChunkKV(self._keys, self._values, self.token_ids, self.prefix_hash,
                       self.profile, self.context_tag, self.context_shift)

    def close(self) -> None:
        # reads not started are dropped; those under way finish before the file is closed
        running = [f for f in self._ahead.values() if not f.cancel()]
        self._ahead.clear()
        wait_all(running)
        self._reader.close()


def _read_ahead(entry: weakref.ref[EncodedLayeredEntry], i: int) -> None:
    """Layer ``i`` of ``entry`` read by the pool; nothing when the entry is gone (dropped
    without ``close``)."""
    alive = entry()
    if alive is not None:
        alive._read_layer(i)


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


_pool: FetchPool | None = None
_pool_lock = threading.Lock()
_exiting = False


def _read_pool() -> FetchPool | None:
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
