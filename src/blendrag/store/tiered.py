"""The persistent chunk-KV store: RAM LRU → disk → Redis → S3 behind the engine's ``KVStore``
protocol.

Reads go down the tiers and promote a hit into every faster tier; writes go to every tier.
Every key is stored under its namespace's name (``names.py``): ``namespaced(ns)`` is another
namespace's view of the same tiers, and with ``auth_key`` every byte tier signs and checks its
entries (``auth.py``).
A failure of a slow tier is a miss: a tier that is unusable (read-only or full disk, Redis
down) is benched at once, one that keeps failing (descriptors exhausted, short replies) after
repeated failures (``TierHealth``). An entry whose stored bytes fail a check is a logged miss
and is deleted; one that only a single read saw damaged is kept (``TierSlot.judge``). ``get``
and ``put`` therefore never raise for storage reasons.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.locked import locked_empty
from blendrag.store.codec import Entry
from blendrag.store.config import StoreConfig
from blendrag.store.counted import CountedLayeredEntry
from blendrag.store.disk import DiskTier
from blendrag.store.layered import LayeredEntry
from blendrag.store.names import Named, Names
from blendrag.store.protocol import StoreStats, TierCounters, TierStats, TierUsage
from blendrag.store.ram import RamTier
from blendrag.store.redis_tier import RedisTier
from blendrag.store.slot import TierSlot
from blendrag.store.tier import Tier

log = logging.getLogger("blendrag.store")


class TieredKVStore(Named):
    """Chunk-KV store over the tiers ``config`` enables (see ``StoreConfig``); a ``KVStore``.

    Tiers, fastest first: RAM (``RamTier``), disk (``DiskTier``), Redis (``RedisTier``), S3
    (``S3Tier``); every one is used through the same ``Tier`` interface, each in its
    ``TierSlot`` (``tiers``). Returned entries are shared with the RAM tier: treat their
    tensors as read-only.
    """

    def __init__(self, config: StoreConfig | None = None,
                 wrap: Callable[[Tier], Tier] | None = None) -> None:
        """``wrap``: applied to every tier before use (e.g. ``throttle.ThrottledTier``, the
        benchmarks' model of a slower device)."""
        self.config = config = config if config is not None else StoreConfig()
        self.names = config.names
        # a namespace every namespace of this store also reads (never writes), if any
        self.public = (None if config.public_namespace is None
                       else Names(config.public_namespace, config.auth_key))
        self._owner = True  # a namespaced view shares the tiers and does not close them
        self._wrap = wrap
        self._gets = TierCounters()  # store level: hits/misses over all tiers
        self._slots: list[TierSlot] = []
        if config.ram_bytes:
            self._add(RamTier(config.ram_bytes))
        fmt, keys, seal = config.kv_format, config.auth_key, config.encrypt
        if config.disk_dir is not None:
            self._add(DiskTier(config.disk_dir, config.disk_bytes, config.disk_timeout_s,
                               kv_format=fmt, store_keys=keys, encrypt=seal))
        if config.redis_url is not None:
            self._add(RedisTier(config.redis_url, config.redis_prefix, config.redis_ttl_s,
                                config.redis_timeout_s, kv_format=fmt, store_keys=keys,
                                encrypt=seal))
        if config.s3_url is not None:
            from blendrag.store.s3_tier import S3Tier  # boto3 is an extra: blendrag[s3]

            self._add(S3Tier(config.s3_url, config.s3_endpoint_url, config.s3_timeout_s,
                             kv_format=fmt, store_keys=keys, encrypt=seal))

    def _add(self, tier: Tier) -> None:
        tier = self._wrap(tier) if self._wrap is not None else tier
        slot = TierSlot(tier, self.config.retry_after_s)
        self._slots.append(slot)
        slot.call("open", tier.open, None)  # warn at start-up, not at the first request

    @property
    def tiers(self) -> tuple[TierSlot, ...]:
        """Each tier in its slot, fastest first: ``slot.tier`` (the tier, as ``wrap`` made it),
        ``slot.health`` (benched or not, its strikes) and ``slot.counters``. For tools and
        tests that look at one tier; reads and writes go through the store."""
        return tuple(self._slots)

    def namespaced(self, namespace: str) -> TieredKVStore:
        """This store's tiers as ``namespace`` sees them: its own entries only, under its own
        names (the same tiers, health and counters; closing the view closes nothing)."""
        view = copy.copy(self)
        public = self.config.public_namespace
        # the public namespace's own view (its ingestion job) reads no other public corpus
        view.config = dataclasses.replace(self.config, namespace=namespace,
                                          public_namespace=None if namespace == public
                                          else public)
        view.names = view.config.names
        view._owner = False
        return view

    # -- KVStore protocol ------------------------------------------------------------------

    def get(self, key: str) -> ChunkKV | None:
        """The entry for ``key`` from the fastest tier that has a valid one, or None; a hit is
        copied into every faster tier."""
        entry = None
        for name in self._readable(key):
            for i, slot in enumerate(self._slots):
                entry = slot.read(name)
                if entry is not None:
                    for faster in self._slots[:i]:
                        faster.write(entry)
                    break
            if entry is not None:
                break
        self._gets.add(hits=entry is not None, misses=entry is None)
        return entry.kv if entry is not None else None

    def open_layers(self, key: str) -> LayeredEntry | None:
        """The entry for ``key`` from the fastest tier that has one, opened for layer-wise
        reads (``store/layered.py``), or None. A layer that fails later raises
        ``LayerReadError`` (the entry is dropped, or its tier benched); an entry read through
        is copied into every faster tier when it is closed."""
        for name in self._readable(key):
            for i, slot in enumerate(self._slots):
                entry = slot.open_layers(name)
                if entry is not None:
                    self._gets.add(hits=1)
                    return CountedLayeredEntry(slot, self._slots[:i], entry, key)
        self._gets.add(misses=1)
        return None

    def _readable(self, key: str) -> list[str]:
        """The names ``key`` is read under: this namespace's, then the public one's (a corpus
        the ingestion job shares with every namespace; never written by a request)."""
        names = [self.names.stored(key)]
        if self.public is not None and self.public.namespace != self.names.namespace:
            names.append(self.public.stored(key))
        return names

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True, exact: bool = False) -> None:
        """Write ``kv`` to every tier. ``ram=False`` (bulk precompute) skips the volatile (RAM)
        tier so as not to evict the entries being served, unless no persistent tier took it.
        ``exact``: the persistent tiers store it in the model's dtype whatever ``kv_format``."""
        # locked host memory only for rows the RAM tier will hold (kv/locked.py)
        volatile = [s.tier.volatile for s in self._slots]
        to_ram = any(volatile) and (ram or all(volatile))
        entry = Entry(self.names.stored(key), _on_cpu(kv, locked=to_ram), exact=exact)
        stored = any([s.write(entry) for s in self._slots if not s.tier.volatile])
        if ram or not stored:
            for slot in self._slots:
                if slot.tier.volatile:
                    slot.write(entry)

    def contains(self, key: str) -> bool:
        """True when some tier holds ``key``; loads nothing and does not count as a use."""
        return any(slot.call("look up", partial(slot.tier.contains, name), False)
                   for name in self._readable(key) for slot in self._slots)

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

        return [k for k in keys
                if not any(holds(i, self.names.stored(k)) for i in range(len(slots)))]

    def unwritable(self) -> str | None:
        """Why no persistent tier can take entries now (each tried: opened, or probed when
        benched); None when one can, or when the store has none (RAM only, by design)."""
        slots = [s for s in self._slots if not s.tier.volatile]
        for slot in slots:
            slot.call("open", slot.tier.open, None)
        if not slots or any(s.health.available for s in slots):
            return None
        return "; ".join(s.health.last_error or s.tier.label for s in slots)

    def problems(self) -> list[str]:
        """Why each benched tier is benched (its last failure), fastest tier first."""
        return [s.health.last_error or s.tier.label for s in self._slots
                if not s.health.available]

    @property
    def disk_dir(self) -> Path | None:
        """The disk tier's folder (None: no disk tier)."""
        return None if self.config.disk_dir is None else Path(self.config.disk_dir)

    def location(self) -> str | None:
        """The disk folder, the Redis URL and prefix and the S3 URL (``StoreConfig.location``);
        None with none of them (RAM only)."""
        return self.config.location()

    def stats(self) -> StoreStats:
        """Snapshot of the counters since opening (or ``reset_stats``) and of each tier's usage."""
        tiers = []
        for slot in self._slots:
            usage = slot.call("report usage", slot.tier.usage, TierUsage(None, None, None))
            tiers.append(TierStats(name=slot.tier.name, available=slot.health.available,
                                   entries=usage.entries,
                                   used_bytes=usage.used_bytes, budget_bytes=usage.budget_bytes,
                                   **slot.counters.snapshot()))
        g = self._gets.snapshot()
        return StoreStats(gets=int(g["hits"] + g["misses"]), hits=int(g["hits"]),
                          misses=int(g["misses"]), tiers=tuple(tiers))

    # -- bulk and maintenance ----------------------------------------------------------------

    def delete(self, key: str) -> None:
        """Drop ``key`` from every tier."""
        name = self.names.stored(key)
        for slot in self._slots:
            slot.delete(name)

    def clear(self) -> None:
        """Drop every entry of this store's namespace from every tier (Redis and S3: only
        names under this store's prefix; other namespaces' entries stay)."""
        ns_id = self.names.ns_id
        for slot in self._slots:
            slot.call("clear", partial(slot.tier.clear, ns_id), None)

    def reset_stats(self) -> None:
        """Zero every counter (usage figures are live and are not affected)."""
        for c in [self._gets, *(s.counters for s in self._slots)]:
            c.reset()

    def close(self) -> None:
        if not self._owner:
            return
        for slot in self._slots:
            slot.call("close", slot.tier.close, None)

    def __enter__(self) -> TieredKVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _on_cpu(kv: ChunkKV, locked: bool) -> ChunkKV:
    """``kv`` with its rows on the host: a blocking copy, so that the bytes are complete when
    encoded (the priors are host tensors already: ChunkKV keeps them there). ``locked``: rows
    from a CUDA device go to page-locked memory of their exact size, K and V in one block
    (kv/locked.py), which a later copy to the device reads by DMA without staging (pageable
    where none can be had); not for rows only encoded for the persistent tiers (a bulk job's),
    which would pay the locking for nothing."""
    if kv.keys.device.type == "cpu":
        return kv
    pair = (locked_empty((2, *kv.keys.shape), kv.keys.dtype)
            if locked and kv.keys.device.type == "cuda" else None)  # [2, L, Hkv, T, D]
    if pair is None:
        return dataclasses.replace(kv, keys=kv.keys.to("cpu"), values=kv.values.to("cpu"))
    pair[0].copy_(kv.keys)
    pair[1].copy_(kv.values)
    return dataclasses.replace(kv, keys=pair[0], values=pair[1])
