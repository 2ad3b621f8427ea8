"""One tier of a ``TieredKVStore`` with its health and counters: every operation on a tier goes
through its ``TierSlot``, which counts it and turns a failure into a miss.

A storage failure (one of the tier's ``errors``) benches the tier for a while
(``TierHealth``); a defective entry (``EntryError``) is a logged miss and is deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from blendrag.store.codec import Entry, EntryError
from blendrag.store.health import TierHealth
from blendrag.store.layered import LayeredEntry, MemoryLayeredEntry
from blendrag.store.protocol import TierCounters, TierUsage
from blendrag.store.ram import held_bytes

log = logging.getLogger("blendrag.store")

T = TypeVar("T")


class Tier(Protocol):
    """One level of a ``TieredKVStore`` (``RamTier``, or a ``ByteTier`` behind ``EncodedTier``).

    ``read`` returns the entry and the bytes it read, or None; it raises ``EntryError`` for a
    defective entry and one of ``errors`` for a storage failure. ``write`` returns the bytes
    stored, 0 when the entry does not fit. ``volatile``: lives in this process's memory (bulk
    writes skip it when a persistent tier takes the entry)."""

    name: str
    errors: tuple[type[BaseException], ...]
    volatile: bool

    @property
    def label(self) -> str: ...
    def open(self) -> object: ...
    def read(self, key: str) -> tuple[Entry, int] | None: ...
    def open_layers(self, key: str) -> LayeredEntry | None: ...
    def write(self, entry: Entry) -> int: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def clear(self) -> None: ...
    def usage(self) -> TierUsage: ...
    def close(self) -> None: ...


class TierSlot:
    """``tier`` with its health (benched after a failure for ``retry_after_s``) and counters."""

    def __init__(self, tier: Tier, retry_after_s: float) -> None:
        self.tier = tier
        self.health = TierHealth(tier.label, retry_after_s)
        self.counters = TierCounters()

    def call(self, action: str, fn: Callable[[], T], default: T) -> T:
        """``fn()`` unless the tier is benched (then ``default``); a storage failure benches the
        tier and returns ``default``."""
        if not self.health.available:
            return default
        try:
            return fn()
        except self.tier.errors as exc:
            self.counters.add(errors=1)
            self.health.failed(action, exc)
            return default

    def delete(self, key: str) -> None:
        self.call("delete", lambda: self.tier.delete(key), None)

    def read(self, key: str) -> Entry | None:
        """The tier's whole entry for ``key``, counted; None for a miss or a defective entry
        (deleted)."""
        t0 = time.perf_counter()
        found = self._guarded(key, t0, lambda: self.tier.read(key))
        if found is None:
            return None
        entry, size = found
        self.counters.add(hits=1, bytes_read=size, load_seconds=time.perf_counter() - t0)
        return entry

    def open_layers(self, key: str) -> LayeredEntry | None:
        """The tier's entry for ``key`` opened for layer-wise reads (its layers' bytes are
        counted as they are read: ``CountedLayeredEntry``); None as for ``read``."""
        t0 = time.perf_counter()
        found = self._guarded(key, t0, lambda: self.tier.open_layers(key))
        if found is None:
            return None
        held = held_bytes(found.kv) if isinstance(found, MemoryLayeredEntry) else 0
        self.counters.add(hits=1, bytes_read=held, load_seconds=time.perf_counter() - t0)
        return found

    def _guarded(self, key: str, t0: float, read: Callable[[], T | None]) -> T | None:
        """``read()``, a miss counted when it finds nothing or the entry is defective."""
        if not self.health.available:
            return None
        try:
            found = self.call("read", read, None)
        except EntryError as exc:
            log.warning("KV store: %s entry %s is unusable (%s); treated as a miss and deleted",
                        self.tier.name, key[:16], exc)
            self.counters.add(misses=1, corrupt=1, load_seconds=time.perf_counter() - t0)
            self.delete(key)
            return None
        if found is None:
            self.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
        return found

    def write(self, entry: Entry) -> bool:
        """Store ``entry``; False when the tier is benched, failed or the entry does not fit."""
        stored = self.call("write", lambda: self.tier.write(entry), 0)
        if stored:
            self.counters.add(bytes_written=stored)
        elif self.health.available:
            log.debug("KV store: entry %s exceeds the %s budget; not stored", entry.key[:16],
                      self.tier.name)
        return bool(stored)
