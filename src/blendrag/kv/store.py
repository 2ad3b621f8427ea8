"""The small interface between the engine and any KV store (RAM dict, tiered persistent store).

The engine only ever calls ``get``, ``put`` and ``contains`` with a content key (see
``kv.keys``); how and where the bytes live is the store's business (``blendrag.store``
implements the persistent tiers and uses ``MemoryKVStore`` as its RAM tier).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Iterable, Protocol, runtime_checkable

from blendrag.kv.chunk_kv import ChunkKV


def held_bytes(kv: ChunkKV) -> int:
    """Host memory an entry holds: its K and V rows (``ChunkKV.nbytes``) plus its
    context-sensitivity profile where it has one (4 bytes a token). What the RAM tier's byte
    budget counts; ``ChunkKV.nbytes`` stays the size of the KV rows alone."""
    extra = kv.sensitivity.numel() * kv.sensitivity.element_size() if kv.sensitivity is not None else 0
    return kv.nbytes + extra


@runtime_checkable
class KVStore(Protocol):
    """What the engine needs from a chunk-KV store."""

    def get(self, key: str) -> ChunkKV | None:
        """Return the entry for ``key`` or None on a miss (never raise for a bad entry)."""

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True) -> None:
        """Store ``kv`` under ``key`` (write-through to every tier). ``ram=False``: a bulk write
        (precompute) that need not displace RAM entries where a slower tier holds it."""

    def contains(self, key: str) -> bool:
        """True when ``key`` is present in some tier (cheap, no load)."""

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys no tier holds, in order (one call for a whole precompute batch)."""


class MemoryKVStore:
    """In-process LRU bounded in bytes: the default store, and the RAM tier of the tiered store.

    An entry counts its KV rows and its profile (:func:`held_bytes`).

    Entries are held by reference: callers must treat returned tensors as read-only.
    Thread-safe (one lock around the ordered dict).
    """

    def __init__(self, max_bytes: int = 8 << 30) -> None:
        if max_bytes <= 0:
            raise ValueError(f"MemoryKVStore max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[str, ChunkKV] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> ChunkKV | None:
        """The entry for ``key`` (now the most recently used) or None."""
        with self._lock:
            kv = self._entries.get(key)
            if kv is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return kv

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True) -> None:
        """Insert ``kv`` as most recently used, evicting least recently used entries to fit
        (``ram`` is moot: RAM is the only tier here)."""
        with self._lock:
            self._pop(key)
            size = held_bytes(kv)
            if size > self.max_bytes:
                return  # larger than the whole budget: not cacheable here
            self._entries[key] = kv
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= held_bytes(old)

    def contains(self, key: str) -> bool:
        """True when ``key`` is held (does not count as a use)."""
        with self._lock:
            return key in self._entries

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys not held, in order."""
        with self._lock:
            return [k for k in keys if k not in self._entries]

    def delete(self, key: str) -> None:
        """Drop ``key`` if present."""
        with self._lock:
            self._pop(key)

    def keys(self) -> list[str]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)

    def _pop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= held_bytes(old)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self.bytes = 0
