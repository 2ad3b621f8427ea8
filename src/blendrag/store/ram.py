"""RAM: an in-process LRU bounded in bytes, the engine's default store and the tiered store's
fastest tier.

``MemoryKVStore`` is a ``KVStore`` on its own; ``RamTier`` puts one in front of the persistent
tiers of a ``TieredKVStore``. Both hold entries by reference: treat returned tensors as read-only.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.locked import release
from blendrag.store.codec import Entry
from blendrag.store.layered import MemoryLayeredEntry
from blendrag.store.names import Named, Names, split
from blendrag.store.protocol import StoreStats, TierCounters, TierStats, TierUsage
from blendrag.store.tier import Tier


def held_bytes(kv: ChunkKV) -> int:
    """Host memory an entry holds: its K and V rows (``ChunkKV.nbytes``) plus its per-token
    priors where it has them (profile: 4 bytes a token; context shift: 4 bytes a token and
    layer). What the RAM tier's byte budget counts; ``ChunkKV.nbytes`` stays the size of the KV
    rows alone."""
    return kv.nbytes + kv.extra_nbytes


class MemoryKVStore(Named):
    """In-process LRU bounded in bytes: the default store, and the RAM tier of the tiered store.

    An entry counts its KV rows and its profile (:func:`held_bytes`).

    Entries are held by reference: callers must treat returned tensors as read-only.
    Thread-safe (one lock around the ordered dict).
    """

    def __init__(self, max_bytes: int = 8 << 30) -> None:
        if max_bytes <= 0:
            raise ValueError(f"MemoryKVStore max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self._held = [0]  # bytes held, shared with namespaced views
        self._entries: OrderedDict[str, ChunkKV] = OrderedDict()
        self._lock = threading.Lock()
        self._counters = TierCounters()
        self.names = Names()

    @property
    def bytes(self) -> int:
        """Bytes held now, every namespace's."""
        return self._held[0]

    def namespaced(self, namespace: str) -> MemoryKVStore:
        """This store as ``namespace`` sees it: its own entries only (the same memory, budget
        and counters)."""
        view = copy.copy(self)
        view.names = Names(namespace)
        return view

    @property
    def hits(self) -> int:
        return int(self._counters.hits)

    @property
    def misses(self) -> int:
        return int(self._counters.misses)

    def get(self, key: str) -> ChunkKV | None:
        """The entry for ``key`` (now the most recently used) or None."""
        t0 = time.perf_counter()
        name = self.names.stored(key)
        with self._lock:
            kv = self._entries.get(name)
            if kv is not None:
                self._entries.move_to_end(name)
        self._counters.add(hits=kv is not None, misses=kv is None,
                           bytes_read=0 if kv is None else held_bytes(kv),
                           load_seconds=time.perf_counter() - t0)
        return kv

    def open_layers(self, key: str) -> MemoryLayeredEntry | None:
        """The entry for ``key`` as a layered entry (views: nothing more to read), or None."""
        kv = self.get(key)
        return None if kv is None else MemoryLayeredEntry(kv, key, "ram")

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True, exact: bool = False) -> None:
        """Insert ``kv`` as most recently used, evicting least recently used entries to fit
        (``ram`` and ``exact`` are moot: RAM is the only tier here and holds the rows as
        they are)."""
        size, key = held_bytes(kv), self.names.stored(key)
        with self._lock:
            self._pop(key)
            if size > self.max_bytes:
                return  # larger than the whole budget: not cacheable here
            self._entries[key] = kv
            self._held[0] += size
            while self._held[0] > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._held[0] -= held_bytes(old)
        self._counters.add(bytes_written=size)

    def contains(self, key: str) -> bool:
        """True when ``key`` is held (does not count as a use)."""
        with self._lock:
            return self.names.stored(key) in self._entries

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys not held, in order."""
        with self._lock:
            return [k for k in keys if self.names.stored(k) not in self._entries]

    def unpersisted(self, keys: Iterable[str]) -> list[str]:
        """No tier persists here: the keys not held."""
        return self.missing(keys)

    def unwritable(self) -> str | None:
        return None  # memory only by design

    def problems(self) -> list[str]:
        return []  # memory does not fail for storage reasons

    @property
    def disk_dir(self) -> None:
        return None

    def location(self) -> None:
        return None  # nothing outlives the process

    def close(self) -> None:
        release()  # locked memory of entries dropped since the last put (kv/locked.py)

    def delete(self, key: str) -> None:
        """Drop ``key`` if present."""
        with self._lock:
            self._pop(self.names.stored(key))
        release()

    def keys(self) -> list[str]:
        """Stored names (every namespace's) from least to most recently used."""
        with self._lock:
            return list(self._entries)

    def usage(self) -> TierUsage:
        """Entries and bytes held now, and the byte budget."""
        with self._lock:
            return TierUsage(len(self._entries), self._held[0], self.max_bytes)

    def stats(self) -> StoreStats:
        """Gets since creation, as one ``ram`` tier."""
        c = self._counters.snapshot()
        u = self.usage()
        tier = TierStats(name="ram", available=True, entries=u.entries, used_bytes=u.used_bytes,
                         budget_bytes=u.budget_bytes, **c)
        return StoreStats(gets=int(c["hits"] + c["misses"]), hits=int(c["hits"]),
                          misses=int(c["misses"]),
                          tiers=(tier,))

    def _pop(self, key: str) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._held[0] -= held_bytes(old)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self, namespace_id: str | None = None) -> None:
        """Drop every entry of this store's namespace (``namespace_id``: of that one instead,
        "" the default one); other namespaces' entries stay."""
        ns_id = self.names.ns_id if namespace_id is None else namespace_id
        with self._lock:
            for key in [k for k in self._entries if split(k)[0] == ns_id]:
                self._pop(key)
        release()


class RamTier(Tier):
    """The fastest tier of a ``TieredKVStore``: a ``MemoryKVStore`` of ``max_bytes``.

    ``volatile``: it lives and dies with the process, so a bulk write (``put(..., ram=False)``)
    skips it when a persistent tier takes the entry. Nothing here fails for storage reasons (no
    ``errors``), and there is nothing to open or close."""

    name = "ram"
    volatile = True

    def __init__(self, max_bytes: int) -> None:
        self.lru = MemoryKVStore(max_bytes)

    @property
    def label(self) -> str:
        return "RAM tier"

    def read(self, key: str) -> tuple[Entry, int] | None:
        """The entry and the bytes it holds, or None."""
        kv = self.lru.get(key)
        return None if kv is None else (Entry(key, kv), held_bytes(kv))

    def open_layers(self, key: str) -> MemoryLayeredEntry | None:
        """The entry as a layered entry over the held tensors, or None."""
        return self.lru.open_layers(key)

    def write(self, entry: Entry) -> int:
        """Hold ``entry.kv``; the bytes it holds, 0 when it exceeds the budget."""
        self.lru.put(entry.key, entry.kv)
        return held_bytes(entry.kv) if self.lru.contains(entry.key) else 0

    def contains(self, key: str) -> bool:
        return self.lru.contains(key)

    def delete(self, key: str) -> None:
        self.lru.delete(key)

    def clear(self, namespace_id: str = "") -> None:
        self.lru.clear(namespace_id)

    def usage(self) -> TierUsage:
        return self.lru.usage()
