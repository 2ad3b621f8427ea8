"""The persistent chunk-KV store: RAM LRU → disk → Redis behind the engine's ``KVStore`` protocol.

Reads go down the tiers and promote a hit into every faster tier; writes go to every tier.
Any failure of a slow tier (read-only or full disk, Redis down) is logged once and the tier is
benched (``TierHealth``); a defective entry is a logged miss and is deleted. ``get`` and
``put`` therefore never raise for storage reasons.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import Entry, EntryError, RangeReader, decode, file_reader, open_entry
from blendrag.store.config import StoreConfig
from blendrag.store.counted import CountedLayeredEntry
from blendrag.store.disk import DiskTier
from blendrag.store.health import TierHealth
from blendrag.store.layered import EncodedLayeredEntry, MemoryLayeredEntry, LayeredEntry
from blendrag.store.protocol import ByteTier, StoreStats, TierCounters, TierStats, TierUsage
from blendrag.store.ram import RamTier, held_bytes
from blendrag.store.redis_tier import RedisTier

log = logging.getLogger("blendrag.store")


class Tier(Protocol):
    """One level of a ``TieredKVStore`` (``RamTier``, or a ``ByteTier`` behind ``EncodedTier``).

    ``read`` returns the entry and the bytes it read, or None; it raises ``EntryError`` for a
    defective entry and one of ``errors`` for a storage failure. ``write`` returns the bytes
    stored, 0 when the entry does not fit. ``volatile``: lives in this process's memory (bulk
    writes skip it when a persistent tier takes the entry)."""

    name: str
    label: str
    errors: tuple[type[BaseException], ...]
    volatile: bool

    def open(self) -> object: ...
    def read(self, key: str) -> tuple[Entry, int] | None: ...
    def open_layers(self, key: str) -> LayeredEntry | None: ...
    def write(self, entry: Entry) -> int: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def clear(self) -> None: ...
    def usage(self) -> TierUsage: ...
    def close(self) -> None: ...


class EncodedTier:
    """A ``ByteTier`` (disk, Redis) as a ``Tier``: entries encoded on the way in, decoded and
    verified on the way out (whole, or layer by layer: ``open_layers``)."""

    volatile = False

    def __init__(self, tier: ByteTier) -> None:
        self.tier = tier
        self.name, self.label, self.errors = tier.name, tier.label, tier.errors

    def open(self) -> object:
        return self.tier.open()

    def read(self, key: str) -> tuple[Entry, int] | None:
        source = self.tier.fetch(key)
        if source is None:
            return None
        try:
            size = _size_of(source)
            kv = decode(source, key)
        finally:
            if hasattr(source, "close"):
                source.close()
        return Entry(key, kv, source if isinstance(source, bytes) else None), size

    def open_layers(self, key: str) -> EncodedLayeredEntry | None:
        """The entry opened for layer-wise reads: header and priors read and verified now,
        each layer when asked for (disk: positioned reads on the file; Redis: GETRANGE)."""
        opener = getattr(self.tier, "open_ranges", None)
        source = opener(key) if opener is not None else self.tier.fetch(key)
        if source is None:
            return None
        if not isinstance(source, (bytes, RangeReader)):  # an open entry file
            try:
                source = file_reader(source)
            except BaseException:
                source.close()
                raise
        reader = open_entry(source, key)  # closes the source when the header is bad
        try:
            return EncodedLayeredEntry(reader, key, self.name)
        except BaseException:
            reader.close()
            raise

    def write(self, entry: Entry) -> int:
        data = entry.data
        return len(data) if self.tier.put(entry.key, data) else 0

    def contains(self, key: str) -> bool:
        return self.tier.contains(key)

    def delete(self, key: str) -> None:
        self.tier.delete(key)

    def clear(self) -> None:
        self.tier.clear()

    def usage(self) -> TierUsage:
        return self.tier.usage()

    def close(self) -> None:
        self.tier.close()


@dataclass
class _Slot:
    tier: Tier
    health: TierHealth
    counters: TierCounters = field(default_factory=TierCounters)


class TieredKVStore:
    """Chunk-KV store over the tiers ``config`` enables (see ``StoreConfig``); a ``KVStore``.

    Tiers, fastest first: RAM (``RamTier``), disk (``DiskTier``), Redis (``RedisTier``); every
    one is used through the same ``Tier`` interface. Returned entries are shared with the RAM
    tier: treat their tensors as read-only.
    """

    def __init__(self, config: StoreConfig | None = None,
                 wrap: Callable[[Tier], Tier] | None = None) -> None:
        """``wrap``: applied to every tier before use (e.g. ``throttle.ThrottledTier``, the
        benchmarks' model of a slower device)."""
        self.config = config = config if config is not None else StoreConfig()
        self._wrap = wrap
        self._gets = TierCounters()  # store level: hits/misses over all tiers
        self._slots: list[_Slot] = []
        if config.ram_bytes:
            self._add(RamTier(config.ram_bytes))
        if config.disk_dir is not None:
            self._add(EncodedTier(DiskTier(config.disk_dir, config.disk_bytes,
                                           config.disk_timeout_s)))
        if config.redis_url is not None:
            self._add(EncodedTier(RedisTier(config.redis_url, config.redis_prefix,
                                            config.redis_ttl_s,
                                            config.redis_timeout_s)))

    def _add(self, tier: Tier) -> None:
        tier = self._wrap(tier) if self._wrap is not None else tier
        slot = _Slot(tier, TierHealth(tier.label, self.config.retry_after_s))
        self._slots.append(slot)
        self._call(slot, "open", tier.open)  # warn at start-up, not at the first request

    # -- KVStore protocol ------------------------------------------------------------------

    def get(self, key: str) -> ChunkKV | None:
        """The entry for ``key`` from the fastest tier that has a valid one, or None; a hit is
        copied into every faster tier."""
        entry = None
        for i, slot in enumerate(self._slots):
            entry = self._read(slot, key)
            if entry is not None:
                for faster in self._slots[:i]:
                    self._write(faster, entry)
                break
        self._gets.add(hits=entry is not None, misses=entry is None)
        return entry.kv if entry is not None else None

    def open_layers(self, key: str) -> LayeredEntry | None:
        """The entry for ``key`` from the fastest tier that has one, opened for layer-wise
        reads (``store/layered.py``), or None. A layer that fails later raises
        ``LayerReadError`` (the entry is dropped, or its tier benched); an entry read through
        is copied into every faster tier when it is closed."""
        for i, slot in enumerate(self._slots):
            entry = self._read(slot, key, layered=True)
            if entry is not None:
                self._gets.add(hits=1)
                return CountedLayeredEntry(self, slot, self._slots[:i], entry)
        self._gets.add(misses=1)
        return None

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True) -> None:
        """Write ``kv`` to every tier. ``ram=False`` (bulk precompute) skips the volatile (RAM)
        tier so as not to evict the entries being served, unless no persistent tier took it."""
        entry = Entry(key, _on_cpu(kv))
        stored = any([self._write(s, entry) for s in self._slots if not s.tier.volatile])
        if ram or not stored:
            for slot in self._slots:
                if slot.tier.volatile:
                    self._write(slot, entry)

    def contains(self, key: str) -> bool:
        """True when some tier holds ``key``; loads nothing and does not count as a use."""
        return any(self._call(s, "look up", lambda s=s: s.tier.contains(key),
                              False) for s in self._slots)

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys no tier holds, in order: what a precompute job still has to compute."""
        return [k for k in keys if not self.contains(k)]

    def unpersisted(self, keys: Iterable[str]) -> list[str]:
        """The keys no persistent tier (disk, Redis) holds, in order; in a store without one,
        the keys no tier holds. What a bulk job could not store (a benched tier holds none)."""
        slots = [s for s in self._slots if not s.tier.volatile] or self._slots
        # Benched tiers are asked too: a full disk still answers, and what it stored before
        # it filled up is persisted. A tier that fails is not asked again in this call (a
        # dead Redis would cost a timeout per key).
        failed: set[int] = set()

        def holds(i: int, key: str) -> bool:
            if i in failed:
                return False
            try:
                return slots[i].tier.contains(key)
            except slots[i].tier.errors:
                failed.add(i)
                return False

        return [k for k in keys if not any(holds(i, k) for i in range(len(slots)))]

    def problems(self) -> list[str]:
        """Why each benched tier is benched (its last failure), fastest tier first."""
        return [s.health.last_error or s.tier.label for s in self._slots
                if not s.health.available]

    @property
    def disk_dir(self) -> Path | None:
        """The disk tier's folder (None: no disk tier)."""
        return None if self.config.disk_dir is None else Path(self.config.disk_dir)

    def location(self) -> str | None:
        """The disk folder and the Redis URL and prefix; None with neither (RAM only)."""
        c = self.config
        if c.disk_dir is None and c.redis_url is None:
            return None
        return f"disk={c.disk_dir} redis={c.redis_url} prefix={c.redis_prefix}"

    def stats(self) -> StoreStats:
        """Snapshot of the counters since opening (or ``reset_stats``) and of each tier's usage."""
        tiers = []
        for slot in self._slots:
            usage = self._call(slot, "report usage", slot.tier.usage, TierUsage(None, None, None))
            tiers.append(TierStats(name=slot.tier.name, available=slot.health.available,
                                   entries=usage.entries,
                                   used_bytes=usage.used_bytes, budget_bytes=usage.budget_bytes,
                                   **slot.counters.snapshot()))
        g = self._gets.snapshot()
        return StoreStats(gets=g["hits"] + g["misses"], hits=g["hits"], misses=g["misses"],
                          tiers=tuple(tiers))

    # -- bulk and maintenance ----------------------------------------------------------------

    def put_many(self, items: Iterable[tuple[str, ChunkKV]], *, ram: bool = False) -> int:
        """``put`` each (key, kv); by default not into RAM, so a bulk job does not flush it."""
        n = 0
        for key, kv in items:
            self.put(key, kv, ram=ram)
            n += 1
        return n

    def delete(self, key: str) -> None:
        """Drop ``key`` from every tier."""
        for slot in self._slots:
            self._call(slot, "delete", lambda s=slot: s.tier.delete(key))

    def clear(self) -> None:
        """Drop every entry from every tier (Redis: only keys under this store's prefix)."""
        for slot in self._slots:
            self._call(slot, "clear", slot.tier.clear)

    def reset_stats(self) -> None:
        """Zero every counter (usage figures are live and are not affected)."""
        for c in [self._gets, *(s.counters for s in self._slots)]:
            c.reset()

    def close(self) -> None:
        for slot in self._slots:
            self._call(slot, "close", slot.tier.close)

    def __enter__(self) -> TieredKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _read(self, slot: _Slot, key: str, layered: bool = False):
        """The tier's entry for ``key`` (``layered``: opened for layer-wise reads), counted; a
        defective entry is a logged miss and is deleted."""
        if not slot.health.available:
            return None
        t0 = time.perf_counter()
        read = slot.tier.open_layers if layered else slot.tier.read
        try:
            found = self._call(slot, "read", lambda: read(key))
        except EntryError as exc:
            log.warning("KV store: %s entry %s is unusable (%s); treated as a miss and deleted",
                        slot.tier.name, key[:16], exc)
            slot.counters.add(misses=1, corrupt=1, load_seconds=time.perf_counter() - t0)
            self._call(slot, "delete", lambda: slot.tier.delete(key))
            return None
        if found is None:
            slot.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
            return None
        if layered:  # its layers' bytes are counted as they are read (CountedLayeredEntry)
            held = held_bytes(found.kv) if isinstance(found, MemoryLayeredEntry) else 0
            slot.counters.add(hits=1, bytes_read=held, load_seconds=time.perf_counter() - t0)
            return found
        entry, size = found
        slot.counters.add(hits=1, bytes_read=size, load_seconds=time.perf_counter() - t0)
        return entry

    def _write(self, slot: _Slot, entry: Entry) -> bool:
        stored = self._call(slot, "write", lambda: slot.tier.write(entry), 0)
        if stored:
            slot.counters.add(bytes_written=stored)
        elif slot.health.available:
            log.debug("KV store: entry %s exceeds the %s budget; not stored", entry.key[:16],
                      slot.tier.name)
        return bool(stored)

    def _call(self, slot: _Slot, action: str, fn, default=None):
        """Run a tier operation unless benched; a storage failure benches the tier."""
        if not slot.health.available:
            return default
        try:
            return fn()
        except slot.tier.errors as exc:
            slot.counters.add(errors=1)
            slot.health.failed(action, exc)
            return default


def _on_cpu(kv: ChunkKV) -> ChunkKV:
    # The RAM tier is host memory; a blocking copy so the bytes are complete when encoded.
    tensors = [kv.keys, kv.values, kv.profile, kv.context_shift]
    if all(t is None or t.device.type == "cpu" for t in tensors):
        return kv
    return dataclasses.replace(kv, **{name: t.to("cpu") for name, t in (
        ("keys", kv.keys), ("values", kv.values), ("profile", kv.profile),
        ("context_shift", kv.context_shift)) if t is not None})


def _size_of(source: bytes | BinaryIO) -> int:
    return len(source) if isinstance(source, bytes) else os.fstat(source.fileno()).st_size
