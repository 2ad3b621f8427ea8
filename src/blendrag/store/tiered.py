"""The persistent chunk-KV store: RAM LRU → disk → Redis behind the engine's ``KVStore`` protocol.

Reads go down the tiers and promote a hit into every faster tier; writes go to every tier.
Any failure of a slow tier (read-only or full disk, Redis down) is logged once and the tier is
benched (``TierHealth``); a defective entry is a logged miss and is deleted. ``get`` and
``put`` therefore never raise for storage reasons.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import BinaryIO, Iterable, Protocol

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.store import MemoryKVStore, held_bytes
from blendrag.store.codec import EntryError, decode, encode
from blendrag.store.config import StoreConfig
from blendrag.store.disk import DiskTier
from blendrag.store.health import TierHealth
from blendrag.store.redis_tier import RedisTier
from blendrag.store.stats import StoreStats, TierCounters, TierStats, TierUsage

log = logging.getLogger("blendrag.store")


class ByteTier(Protocol):
    """A tier that stores encoded entries (disk, Redis)."""

    name: str
    label: str
    errors: tuple[type[BaseException], ...]

    def open(self) -> object: ...
    def fetch(self, key: str) -> bytes | BinaryIO | None: ...
    def put(self, key: str, data: bytes) -> bool: ...
    def contains(self, key: str) -> bool: ...
    def delete(self, key: str) -> None: ...
    def clear(self) -> None: ...
    def usage(self) -> TierUsage: ...
    def close(self) -> None: ...


@dataclass
class _Slot:
    tier: ByteTier
    health: TierHealth
    counters: TierCounters = field(default_factory=TierCounters)


class TieredKVStore:
    """Chunk-KV store over the tiers ``config`` enables (see ``StoreConfig``); a ``KVStore``.

    Returned entries are shared with the RAM tier: treat their tensors as read-only.
    """

    def __init__(self, config: StoreConfig | None = None) -> None:
        self.config = config = config if config is not None else StoreConfig()
        self._ram = MemoryKVStore(config.ram_bytes) if config.ram_bytes else None
        self._ram_counters = TierCounters()
        self._gets = TierCounters()  # store level: hits/misses over all tiers
        self._slots: list[_Slot] = []
        if config.disk_dir is not None:
            self._add(DiskTier(config.disk_dir, config.disk_bytes, config.disk_timeout_s))
        if config.redis_url is not None:
            self._add(RedisTier(config.redis_url, config.redis_prefix, config.redis_ttl_s, config.redis_timeout_s))

    def _add(self, tier: ByteTier) -> None:
        slot = _Slot(tier, TierHealth(tier.label, self.config.retry_after_s))
        self._slots.append(slot)
        self._call(slot, "open", tier.open)  # warn at start-up, not at the first request

    # -- KVStore protocol ------------------------------------------------------------------

    def get(self, key: str) -> ChunkKV | None:
        """The entry for ``key`` from the fastest tier that has a valid one, or None."""
        kv = self._get_ram(key)
        if kv is None:
            for i, slot in enumerate(self._slots):
                kv, data = self._load(slot, key)
                if kv is not None:
                    self._promote(key, kv, data, self._slots[:i])
                    break
        self._gets.add(hits=kv is not None, misses=kv is None)
        return kv

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True) -> None:
        """Write ``kv`` to every tier. ``ram=False`` (bulk precompute) skips the RAM tier so as
        not to evict the entries being served, unless no slower tier took the entry."""
        kv = _on_cpu(kv)
        live = [s for s in self._slots if s.health.available]
        stored = False
        if live:
            data = encode(key, kv)
            stored = any([self._write(slot, key, data) for slot in live])
        if (ram or not stored) and self._ram is not None:
            self._put_ram(key, kv)

    def contains(self, key: str) -> bool:
        """True when some tier holds ``key``; loads nothing and does not count as a use."""
        if self._ram is not None and self._ram.contains(key):
            return True
        return any(self._call(s, "look up", lambda s=s: s.tier.contains(key), False) for s in self._slots)

    # -- bulk and maintenance ----------------------------------------------------------------

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys no tier holds, in order: what a precompute job still has to compute."""
        return [k for k in keys if not self.contains(k)]

    def put_many(self, items: Iterable[tuple[str, ChunkKV]], *, ram: bool = False) -> int:
        """``put`` each (key, kv); by default not into RAM, so a bulk job does not flush it."""
        n = 0
        for key, kv in items:
            self.put(key, kv, ram=ram)
            n += 1
        return n

    def delete(self, key: str) -> None:
        """Drop ``key`` from every tier."""
        if self._ram is not None:
            self._ram.delete(key)
        for slot in self._slots:
            self._call(slot, "delete", lambda s=slot: s.tier.delete(key))

    def clear(self) -> None:
        """Drop every entry from every tier (Redis: only keys under this store's prefix)."""
        if self._ram is not None:
            self._ram.clear()
        for slot in self._slots:
            self._call(slot, "clear", slot.tier.clear)

    def stats(self) -> StoreStats:
        """Snapshot of the counters since opening (or ``reset_stats``) and of each tier's usage."""
        tiers = []
        if self._ram is not None:
            usage = TierUsage(len(self._ram), self._ram.bytes, self._ram.max_bytes)
            tiers.append(_tier_stats("ram", True, self._ram_counters, usage))
        for slot in self._slots:
            usage = self._call(slot, "report usage", slot.tier.usage, TierUsage(None, None, None))
            tiers.append(_tier_stats(slot.tier.name, slot.health.available, slot.counters, usage))
        g = self._gets.snapshot()
        return StoreStats(gets=g["hits"] + g["misses"], hits=g["hits"], misses=g["misses"], tiers=tuple(tiers))

    def reset_stats(self) -> None:
        """Zero every counter (usage figures are live and are not affected)."""
        for c in [self._gets, self._ram_counters, *(s.counters for s in self._slots)]:
            c.reset()

    def close(self) -> None:
        for slot in self._slots:
            self._call(slot, "close", slot.tier.close)

    def __enter__(self) -> "TieredKVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _get_ram(self, key: str) -> ChunkKV | None:
        if self._ram is None:
            return None
        t0 = time.perf_counter()
        kv = self._ram.get(key)
        hit = kv is not None
        self._ram_counters.add(hits=hit, misses=not hit, bytes_read=held_bytes(kv) if hit else 0,
                               load_seconds=time.perf_counter() - t0)
        return kv

    def _put_ram(self, key: str, kv: ChunkKV) -> None:
        self._ram.put(key, kv)
        if self._ram.contains(key):
            self._ram_counters.add(bytes_written=held_bytes(kv))

    def _load(self, slot: _Slot, key: str) -> tuple[ChunkKV | None, bytes | None]:
        if not slot.health.available:
            return None, None
        t0 = time.perf_counter()
        source = self._call(slot, "read", lambda: slot.tier.fetch(key))
        if source is None:
            slot.counters.add(misses=1, load_seconds=time.perf_counter() - t0)
            return None, None
        try:
            size = _size_of(source)
            kv = decode(source, key)
        except EntryError as exc:
            log.warning("KV store: %s entry %s is unusable (%s); treated as a miss and deleted",
                        slot.tier.name, key[:16], exc)
            slot.counters.add(misses=1, corrupt=1, load_seconds=time.perf_counter() - t0)
            self._call(slot, "delete", lambda: slot.tier.delete(key))
            return None, None
        finally:
            if hasattr(source, "close"):
                source.close()
        slot.counters.add(hits=1, bytes_read=size, load_seconds=time.perf_counter() - t0)
        return kv, source if isinstance(source, bytes) else None

    def _promote(self, key: str, kv: ChunkKV, data: bytes | None, faster: list[_Slot]) -> None:
        if self._ram is not None:
            self._put_ram(key, kv)
        live = [s for s in faster if s.health.available]
        if live:
            data = data if data is not None else encode(key, kv)
            for slot in live:
                self._write(slot, key, data)

    def _write(self, slot: _Slot, key: str, data: bytes) -> bool:
        stored = self._call(slot, "write", lambda: slot.tier.put(key, data), False)
        if stored:
            slot.counters.add(bytes_written=len(data))
        elif slot.health.available:
            log.debug("KV store: entry %s (%d bytes) exceeds the %s budget; not stored", key[:16], len(data), slot.tier.name)
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
    tensors = [kv.keys, kv.values] + ([kv.sensitivity] if kv.sensitivity is not None else [])
    if all(t.device.type == "cpu" for t in tensors):
        return kv
    sensitivity = kv.sensitivity.to("cpu") if kv.sensitivity is not None else None
    return ChunkKV(kv.keys.to("cpu"), kv.values.to("cpu"), kv.token_ids, kv.prefix_hash, sensitivity)


def _size_of(source: bytes | BinaryIO) -> int:
    return len(source) if isinstance(source, bytes) else os.fstat(source.fileno()).st_size


def _tier_stats(name: str, available: bool, counters: TierCounters, usage: TierUsage) -> TierStats:
    return TierStats(name=name, available=available, entries=usage.entries, used_bytes=usage.used_bytes,
                     budget_bytes=usage.budget_bytes, **counters.snapshot())
