"""The device tier: hot chunk KVs kept in the model's device memory, so that a hit copies
nothing from the host.

A request's cached rows otherwise come from host memory (the RAM tier) or further (disk,
Redis, S3): on a GPU at a 3k-token prompt, copying 384 MiB of rows from pinned RAM took 21 ms
of reuse's 66 ms. vLLM keeps its prefix cache's hot blocks in device memory (a hit is a
pointer); here the same for chunk entries: ``DeviceTier`` holds each entry's stacked K and V
([L, Hkv, T, D], pre-RoPE, as stored) on the device, least recently used evicted first within
``max_bytes``, and a hit is a ``MemoryLayeredEntry`` over them (tier ``"device"``): the layer
feed places its rows device to device.

What it keeps is what the store's tiers gave, never more trusted than that:

- filled by *promotion*: an entry a request read through from the store, every layer read and
  verified against its checksums (``complete``), copied once to the device after the request
  (a keyed store has authenticated it before any layer was read); and by *ingestion on the
  device*: a chunk a request computed (its rows are on the device already);
- keyed by the store's namespace id and the content key (``ChunkCache``): a namespace never
  hits another's rows, as in the store itself;
- the store stays the source of truth: the device tier is a copy, dropped whole when the engine
  changes store (``clear``) and never written back;
- out of device memory: entries are evicted, a copy that still does not fit is skipped; a
  request never fails for it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import replace

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.locked import note_copies
from blendrag.store.layered import LayeredEntry, MemoryLayeredEntry

log = logging.getLogger(__name__)

TIER = "device"
DEFAULT_SHARE = 0.5  # of the device memory free after the model and a request's buffers


class DeviceTier:
    """Chunk KVs on ``device`` under their stored names, LRU within ``max_bytes``."""

    def __init__(self, max_bytes: int, device: torch.device) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"device tier budget must be an int >= 0 bytes, got {max_bytes!r}")
        self.max_bytes, self.device = max_bytes, device
        self._rows: OrderedDict[str, ChunkKV] = OrderedDict()
        self._ready: dict[str, torch.cuda.Event] = {}  # name -> its copy's event (CUDA)
        # promotions copy on a stream of their own: the next request's kernels do not queue
        # behind them, and a hit waits for its copy on the device, not on the host
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.promotions = self.evictions = self.skipped = 0

    @property
    def bytes(self) -> int:
        """Device memory held by the entries (K and V)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, name: str) -> MemoryLayeredEntry | None:
        """The entry stored as ``name``, on the device (its layers are views), or None."""
        with self._lock:
            kv = self._rows.get(name)
            if kv is None:
                return None
            self._rows.move_to_end(name)
            self.hits += 1
            # kept until the copy is seen done: a hit on another thread meanwhile waits too
            ready = self._ready.get(name)
            if ready is not None and ready.query():
                del self._ready[name]
                ready = None
        if self._stream is not None:
            current = torch.cuda.current_stream(self.device)
            if ready is not None:  # the compute stream waits for the copy (no host sync)
                current.wait_event(ready)
            # made on the side stream, used on this one: its memory is not reused by a later
            # copy before this stream is done with it (an eviction meanwhile)
            kv.keys.record_stream(current)
            kv.values.record_stream(current)
        return MemoryLayeredEntry(kv, key=name, tier=TIER)

    def promote(self, name: str, entry: LayeredEntry) -> bool:
        """Keep a copy of ``entry`` (read from the store as ``name``) when every layer of it
        has been read and verified; whether it is held now. Entries computed in the request,
        from the history cache or already on the device are not promoted here."""
        if self.max_bytes == 0 or not entry.complete or entry.tier not in _STORE_TIERS:
            return False  # not read through, or not a store's (computed, history, ours)
        return self.put(name, entry.materialize())

    def put(self, name: str, kv: ChunkKV) -> bool:
        """Hold ``kv`` as ``name`` on the device (copied there unless it is already), evicting
        the least recently used entries to fit; False when it cannot fit (larger than the
        budget, or the device is out of memory even after evicting)."""
        nbytes = _nbytes(kv)
        if nbytes > self.max_bytes:
            return False
        with self._lock:
            if name in self._rows:
                self._rows.move_to_end(name)
                return True
            self._evict(self.max_bytes - nbytes)
        try:
            on_device, ready = self._copy(kv)
        except torch.OutOfMemoryError:
            with self._lock:
                self._evict(0)  # the allocator's cached blocks go back with the entries
            self.skipped += 1
            log.info("device tier: out of device memory for %d bytes; entry not kept", nbytes)
            return False
        with self._lock:
            if name not in self._rows:
                self._evict(self.max_bytes - nbytes)
                self._rows[name] = on_device
                if ready is not None:
                    self._ready[name] = ready
                self._bytes += nbytes
                self.promotions += 1
        return True

    def _copy(self, kv: ChunkKV) -> tuple[ChunkKV, torch.cuda.Event | None]:
        """``kv`` on the device and the event its copy records (None: no copy, or not CUDA)."""
        if self._stream is None or kv.keys.device == self.device:
            return _to_device(kv, self.device), None
        # the side stream first waits for what the compute stream queued (the host rows may
        # have been written by it); pinned host memory is kept until the copy is done
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            on_device = _to_device(kv, self.device)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return on_device, ready

    def discard(self, name: str) -> None:
        """Drop ``name`` if held (the store dropped or replaced its entry)."""
        with self._lock:
            kv = self._rows.pop(name, None)
            self._ready.pop(name, None)
            if kv is not None:
                self._bytes -= _nbytes(kv)

    def clear(self) -> None:
        """Drop every entry (the engine's store changed: its names may mean other rows)."""
        with self._lock:
            self._rows.clear()
            self._ready.clear()
            self._bytes = 0

    def _evict(self, room: int) -> None:
        """Evict least recently used entries until at most ``room`` bytes are held."""
        while self._rows and self._bytes > room:
            name, kv = self._rows.popitem(last=False)
            self._ready.pop(name, None)
            self._bytes -= _nbytes(kv)
            self.evictions += 1


_STORE_TIERS = frozenset({"ram", "disk", "redis", "s3"})  # what a store's tiers are named


def _nbytes(kv: ChunkKV) -> int:
    return kv.keys.numel() * kv.keys.element_size() + kv.values.numel() * kv.values.element_size()


def _to_device(kv: ChunkKV, device: torch.device) -> ChunkKV:
    """``kv`` with K and V on ``device`` (the same object when they are there already; the
    priors stay on the host, where selectors read them)."""
    if kv.keys.device == device and kv.values.device == device:
        return kv
    # k, v: [L, Hkv, T, D]; one copy each (from pinned memory: asynchronous on CUDA, ordered on
    # the current stream before any later use of the tensors; a locked source is kept until
    # the copy is done)
    out = replace(kv, keys=kv.keys.to(device, non_blocking=True),
                  values=kv.values.to(device, non_blocking=True))
    note_copies([kv.keys, kv.values], device)
    return out


def default_budget(device: torch.device, reserve_bytes: int) -> int:
    """The device tier's default budget: ``DEFAULT_SHARE`` of the device memory free now (after
    the model) less ``reserve_bytes`` (the request buffers still to come); 0 on a CPU, where the
    RAM tier is that memory already."""
    if device.type != "cuda":
        return 0
    free, _ = torch.cuda.mem_get_info(device)
    return max(0, int(DEFAULT_SHARE * (free - reserve_bytes)))
