"""The store as one request sees it (``RequestStore``): every call forwarded, and ``stats()``
the request's own. The engine hands each request its store through one, so that the store's
share of a request's stats (``CacheStats.store``) counts what that request's own lookups found,
tier by tier, and the layers it read, never another request's: another tenant's concurrent
hits would otherwise show in it, the store's counters being shared by every namespace."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from blendrag.store.layered import LayeredEntryWrapper
from blendrag.store.protocol import KVStore, StoreStats, TierCounters

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from blendrag.kv.chunk_kv import ChunkKV
    from blendrag.store.layered import LayeredEntry

# counters a request's own calls can only see as the tiers' change over the call (writes and
# failures: the tiers do not say whose they are)
_WINDOWED = ("bytes_written", "corrupt", "errors", "auth_failures")


class RequestStore:
    """``store`` as one request sees it: every call forwarded; ``stats()`` counts this
    request's own calls only (its usage figures are the store's). A lookup's hit counts at the
    tier its entry came from (``LayeredEntry.tier``), a miss at every tier available before it
    (all of them for a miss); bytes read and load seconds are those of the layers this request
    read; bytes written and failures are the tiers' change over this request's own calls."""

    def __init__(self, store: KVStore) -> None:
        self.store = store
        slots = getattr(store, "tiers", None)  # TieredKVStore's slots, fastest first
        self._slots = tuple(slots) if slots is not None else ()
        names = ([s.tier.name for s in self._slots] if slots is not None
                 else [t.name for t in store.stats().tiers])
        self._own = {name: TierCounters() for name in names}
        self._gets = TierCounters()

    def open_layers(self, key: str) -> LayeredEntry | None:
        up = self._available()
        before, t0 = self._window(), time.perf_counter()
        entry = self.store.open_layers(key)
        self._count(entry.tier if entry is not None else None, up, time.perf_counter() - t0)
        self._close_window(before)
        return None if entry is None else _OwnLayers(entry, self)

    def get(self, key: str) -> ChunkKV | None:
        """The entry, counted in the request's gets (a whole entry does not say its tier: no
        tier's counters)."""
        kv = self.store.get(key)
        self._gets.add(hits=kv is not None, misses=kv is None)
        return kv

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True, exact: bool = False) -> None:
        before = self._window()
        self.store.put(key, kv, ram=ram, exact=exact)
        self._close_window(before)

    def stats(self) -> StoreStats:
        """The store's tiers (their usage now) with this request's own counters."""
        base = self.store.stats()
        g = self._gets.snapshot()
        tiers = tuple(replace(t, **self._own.get(t.name, TierCounters()).snapshot())
                      for t in base.tiers)
        return StoreStats(gets=int(g["hits"] + g["misses"]), hits=int(g["hits"]),
                          misses=int(g["misses"]), tiers=tiers)

    def _available(self) -> list[bool]:
        if not self._slots:
            return [True] * len(self._own)
        return [slot.health.available for slot in self._slots]

    def _count(self, tier: str | None, up: list[bool], seconds: float) -> None:
        self._gets.add(hits=tier is not None, misses=tier is None)
        for (name, own), available in zip(self._own.items(), up):
            if name == tier:
                own.add(hits=1, load_seconds=seconds)
                return
            if available:
                own.add(misses=1)

    def _window(self) -> list[dict]:
        """Each tier's counters now (another store than a ``TieredKVStore``: from its stats)."""
        if self._slots:
            return [slot.counters.snapshot() for slot in self._slots]
        return [{c: getattr(t, c) for c in _WINDOWED} for t in self.store.stats().tiers]

    def _close_window(self, before: list[dict]) -> None:
        for own, old, new in zip(self._own.values(), before, self._window()):
            own.add(**{c: new[c] - old[c] for c in _WINDOWED})

    # -- forwarded as they are -------------------------------------------------------------

    def contains(self, key: str) -> bool:
        return self.store.contains(key)

    def missing(self, keys: Iterable[str]) -> list[str]:
        return self.store.missing(keys)

    def unpersisted(self, keys: Iterable[str]) -> list[str]:
        return self.store.unpersisted(keys)

    def unwritable(self) -> str | None:
        return self.store.unwritable()

    def problems(self) -> list[str]:
        return self.store.problems()

    def delete(self, key: str) -> None:
        self.store.delete(key)

    def clear(self) -> None:
        self.store.clear()

    @property
    def namespace(self) -> str:
        return self.store.namespace

    @property
    def namespace_id(self) -> str:
        return self.store.namespace_id

    def namespaced(self, namespace: str) -> KVStore:
        return self.store.namespaced(namespace)

    @property
    def disk_dir(self) -> Path | None:
        return self.store.disk_dir

    def location(self) -> str | None:
        return self.store.location()

    def close(self) -> None:
        self.store.close()


class _OwnLayers(LayeredEntryWrapper):
    """An entry a request opened: each layer's first read counted at its tier in the request's
    ``store``, and what closing it writes (a promotion to faster tiers), every other call
    forwarded (``LayeredEntryWrapper``)."""

    def __init__(self, inner: LayeredEntry, store: RequestStore) -> None:
        super().__init__(inner)
        self._store, self._read = store, set[int]()
        # the loop's thread and the feed's reader may read (and count) layers at once
        self._lock = threading.Lock()
        self._own = store._own.get(inner.tier, TierCounters())

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        rows = self.inner.layer(i)  # each [Hkv, T, D]
        with self._lock:
            first = i not in self._read
            self._read.add(i)
        if first:
            self._own.add(bytes_read=self.inner.stored_layer_nbytes,
                          load_seconds=time.perf_counter() - t0)
        return rows

    def materialize(self) -> ChunkKV:
        if not self.inner.complete:  # layers still to read: each counted as it comes
            for i in range(self.inner.num_layers):
                self.layer(i)
            return self.inner.materialize()
        t0 = time.perf_counter()
        kv = self.inner.materialize()  # read already: nothing to read, only to count
        with self._lock:
            unread = self.inner.num_layers - len(self._read)
            self._read.update(range(self.inner.num_layers))
        if unread:  # each layer's first read counted once, as ``layer`` counts it
            self._own.add(bytes_read=unread * self.inner.stored_layer_nbytes,
                          load_seconds=time.perf_counter() - t0)
        return kv

    def close(self) -> None:
        before = self._store._window()
        self.inner.close()
        self._store._close_window(before)
