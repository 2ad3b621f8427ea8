"""What the engine needs from a chunk-KV store, and the typed statistics every store returns.

``KVStore`` declares every method blendrag calls on a store, with content keys
(``blendrag.kv.keys``); how and where the bytes live is the store's business. Two stores
implement it: ``MemoryKVStore`` (``ram.py``, the engine's default) and ``TieredKVStore``
(``tiered.py``: RAM, disk, Redis and S3 tiers, each a ``tier.Tier``).

Every store reports a ``StoreStats`` snapshot: store-level gets, hits and misses, and one
``TierStats`` per tier (counters since the store was opened, plus what the tier holds now).
The engine attaches ``stats().since(before)`` of each request to its ``RequestStats``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pathlib import Path

    from blendrag.kv.chunk_kv import ChunkKV
    from blendrag.store.layered import LayeredEntry

# Activity counters (a ``since`` delta subtracts them); the other fields are live usage.
_COUNTERS = ("hits", "misses", "corrupt", "errors", "bytes_read", "bytes_written", "load_seconds",
             "auth_failures")


@dataclass(frozen=True)
class TierUsage:
    """What a tier holds now (None where the tier cannot tell cheaply)."""

    entries: int | None
    used_bytes: int | None
    budget_bytes: int | None


@dataclass(frozen=True)
class TierStats:
    """One tier's activity since the store was opened (or ``reset_stats()``) and its usage."""

    name: str
    available: bool
    hits: int
    misses: int
    corrupt: int
    errors: int
    bytes_read: int
    bytes_written: int
    load_seconds: float
    entries: int | None
    used_bytes: int | None
    budget_bytes: int | None
    # entries this store's keys did not authenticate (forged, foreign, unsigned): misses
    auth_failures: int = 0

    def since(self, before: TierStats) -> TierStats:
        """Activity between the snapshot ``before`` and this one; usage stays this snapshot's."""
        return replace(self, **{c: getattr(self, c) - getattr(before, c) for c in _COUNTERS})


@dataclass(frozen=True)
class StoreStats:
    """Snapshot of a store: store-level gets plus per-tier detail, fastest tier first."""

    gets: int
    hits: int
    misses: int
    tiers: tuple[TierStats, ...]

    @property
    def hit_rate(self) -> float:
        return self.hits / self.gets if self.gets else 0.0

    @property
    def auth_failures(self) -> int:
        """Entries the store's keys did not authenticate, over every tier (each a miss)."""
        return sum(t.auth_failures for t in self.tiers)

    def tier(self, name: str) -> TierStats:
        """The tier called ``name`` ("ram", "disk" or "redis"); KeyError if not configured."""
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(f"no tier {name!r}; configured: {[t.name for t in self.tiers]}")

    def since(self, before: StoreStats) -> StoreStats:
        """What happened between the snapshot ``before`` and this one (e.g. one request):
        counters are differences, usage figures (entries, bytes used) are this snapshot's.

        The counters are store-wide: requests served concurrently by other threads on the
        same store are included in each other's deltas."""
        old = {t.name: t for t in before.tiers}
        tiers = tuple(t.since(old[t.name]) if t.name in old else t for t in self.tiers)
        return StoreStats(gets=self.gets - before.gets, hits=self.hits - before.hits,
                          misses=self.misses - before.misses, tiers=tiers)

    def to_dict(self) -> dict:
        """Plain JSON-able form (the engine attaches it to request stats)."""
        return {**asdict(self), "hit_rate": self.hit_rate, "auth_failures": self.auth_failures}

    def format(self) -> str:
        """A small human-readable table."""
        lines = [f"gets {self.gets}  hits {self.hits}  misses {self.misses}  hit rate "
                 f"{self.hit_rate:.1%}"]
        lines.append(f"{'tier':6} {'up':3} {'hits':>7} {'misses':>7} {'corrupt':>7} {'entries':>8} "
                     f"{'used MiB':>9} {'budget MiB':>10} {'load s':>8}")
        for t in self.tiers:
            lines.append(
                f"{t.name:6} {'yes' if t.available else 'no':3} {t.hits:7d} {t.misses:7d} "
                f"{t.corrupt:7d} "
                f"{_opt(t.entries):>8} {_mib(t.used_bytes):>9} {_mib(t.budget_bytes):>10} "
                f"{t.load_seconds:8.3f}"
            )
        return "\n".join(lines)


@dataclass
class TierCounters:
    """Mutable per-tier counters; ``add`` is thread-safe."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    errors: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    load_seconds: float = 0.0
    auth_failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas: float) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {name: getattr(self, name) for name in _COUNTER_NAMES}

    def reset(self) -> None:
        with self._lock:
            for f in fields(self):
                if not f.name.startswith("_"):
                    setattr(self, f.name, f.default)


# the counters' names, listed once: a request snapshots them at each of its store calls
_COUNTER_NAMES = tuple(f.name for f in fields(TierCounters) if not f.name.startswith("_"))


def _opt(n: int | None) -> str:
    return "-" if n is None else str(n)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f}"


@runtime_checkable
class KVStore(Protocol):
    """What blendrag needs from a chunk-KV store. ``get`` and ``open_layers`` never raise for a
    bad entry or a failing tier: those are misses."""

    def get(self, key: str) -> ChunkKV | None:
        """The whole entry for ``key``, or None."""

    def open_layers(self, key: str) -> LayeredEntry | None:
        """The entry for ``key`` opened for layer-wise reads (``store/layered.py``), or None;
        the caller closes it."""

    def put(self, key: str, kv: ChunkKV, *, ram: bool = True, exact: bool = False) -> None:
        """Store ``kv`` under ``key`` (write-through to every tier). ``ram=False``: a bulk write
        (precompute) that need not displace RAM entries where a slower tier holds it.
        ``exact``: kept in the model's dtype whatever the store's ``kv_format`` (a prefix that
        other entries are computed after, rows a full prefill made): a read must give back the
        rows a fresh computation gives."""

    def contains(self, key: str) -> bool:
        """True when ``key`` is present in some tier (cheap, no load)."""

    def missing(self, keys: Iterable[str]) -> list[str]:
        """The keys no tier holds, in order (one call for a whole precompute batch)."""

    def unpersisted(self, keys: Iterable[str]) -> list[str]:
        """The keys no persistent tier holds, in order (a store without one: ``missing``):
        what a bulk job could not store."""

    def unwritable(self) -> str | None:
        """Why no persistent tier can take entries now; None when one can, or when the store
        keeps entries in memory only by design (then there is nothing to persist to)."""

    def problems(self) -> list[str]:
        """Why tiers are out of use now (their last failure), fastest first; [] when none."""

    def delete(self, key: str) -> None:
        """Drop ``key`` from every tier."""

    def clear(self) -> None:
        """Drop every entry of this store's namespace."""

    @property
    def namespace(self) -> str:
        """The namespace the store reads and writes for ("" the default one)."""

    @property
    def namespace_id(self) -> str:
        """The namespace's id in stored names ("" for the default namespace without keys)."""

    def namespaced(self, namespace: str) -> KVStore:
        """The same storage as ``namespace`` sees it: its own entries only."""

    def stats(self) -> StoreStats:
        """Snapshot of the store's counters and of what each tier holds."""

    @property
    def disk_dir(self) -> Path | None:
        """The disk tier's folder (None: no disk tier)."""

    def location(self) -> str | None:
        """Where entries outlive this process, as one string (disk folder, Redis URL and
        prefix); None when they do not (RAM only)."""

    def close(self) -> None:
        """Release files and connections."""

