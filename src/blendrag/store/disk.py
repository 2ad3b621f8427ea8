"""Disk tier: a diskcache directory, bounded in bytes, least-recently-used eviction.

diskcache gives the process safety (SQLite index in WAL mode, one file per entry, writers
serialized by the database lock). What it does not give is added here (and in
``disk_files.py``: no pickle, no file outside the store, unreadable files as failures):

- a hard byte budget: its own cull runs after the insert and removes up to ``cull_limit``
  rows, so the cache can sit above ``size_limit``, and ``cull()`` evicts in batches of ten.
  ``put`` therefore evicts least-recently-used entries one at a time *before* writing, inside
  the same transaction as the insert, so no process ever sees the budget exceeded;
- no descriptor left by a failed open: diskcache opens its SQLite connection before it fails
  on a read-only or damaged directory, and nothing else would close it;
- an index removed under a running process is noticed (its inode changed or it is gone): the
  tier opens the directory again, so its later writes land where other processes look;
- on every open, the entry files no index row references (a writer killed between writing its
  file and committing the row, an index that was removed) are removed, and entries beyond the
  budget evicted: the directory's bytes stay within the budget whatever happened to its index.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sqlite3
import threading
from pathlib import Path
from typing import BinaryIO

import diskcache

from blendrag.store.auth import StoreKeys
from blendrag.store.disk_files import (
    INDEX,
    BytesOnlyDisk,
    UnreadableFile,
    UnsafeFolder,
    entry_files,
    index_identity,
    unreferenced,
)
from blendrag.store.health import TierUnavailable, transient_os_error
from blendrag.store.names import split
from blendrag.store.protocol import TierUsage
from blendrag.store.tier import ByteTier

log = logging.getLogger("blendrag.store")

# Index pages a new row may add (a few 4 KiB SQLite pages); reserved before the insert.
_INDEX_GROWTH = 16 << 10
# The least recently used entry, in diskcache's own table and by the column its LRU policy keeps.
_LRU_ENTRY = "SELECT key FROM Cache WHERE raw = 1 ORDER BY access_time LIMIT 1"
# SQLite failures of one operation (the next may work): busy, out of descriptors, I/O.
_TRANSIENT_SQLITE = ("database is locked", "unable to open database file", "disk i/o error")
# OSErrors that say the whole disk is unusable now.
_DISK_DOWN = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})


class DiskTier(ByteTier):
    """Byte tier on a diskcache directory, shared by every process that opens it.

    ``budget_bytes`` bounds the index plus the entry files (``diskcache.Cache.volume()``);
    None keeps the budget stored in the directory (used by the CLI, which only inspects).
    ``tidy``: on open, remove the entry files no index row references and evict entries beyond
    the budget (the CLI's inspection turns it off: it changes nothing). ``kv_format``: how K and
    V are stored (``ByteTier``). Layer-wise reads are positioned reads on the entry file
    (``ByteTier.open_ranges``).
    """

    name = "disk"
    errors: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, diskcache.Timeout)

    def __init__(self, directory: str | Path, budget_bytes: int | None,
                 timeout_s: float = 10.0, tidy: bool = True, *, kv_format: str = "model",
                 store_keys: StoreKeys | None = None, encrypt: bool = False) -> None:
        super().__init__(kv_format, store_keys, encrypt)
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"DiskTier budget_bytes must be positive, got {budget_bytes}")
        self.directory = Path(directory)
        self._budget = budget_bytes
        self._timeout_s = timeout_s
        self._tidy = tidy
        self._cache: diskcache.Cache | None = None
        self._index: tuple[int, int] | None = None  # identity of the index we opened
        self._open_lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"disk tier at {self.directory}"

    def open(self) -> diskcache.Cache:
        """Open (creating if needed) the cache directory, again when its index was removed or
        replaced since; raises ``TierUnavailable`` when it cannot be opened."""
        with self._open_lock:
            if self._cache is not None and index_identity(self.directory) != self._index:
                log.warning("KV store: the index of %s was removed or replaced under this "
                            "process; opening the directory again", self.label)
                self._close()
            if self._cache is None:
                self._cache = self._connect()
                self._index = index_identity(self.directory)
                if self._tidy:
                    self._tidy_up(self._cache)
            return self._cache

    def _connect(self) -> diskcache.Cache:
        cache = diskcache.Cache.__new__(diskcache.Cache)
        try:
            cache.__init__(str(self.directory), timeout=self._timeout_s, disk=BytesOnlyDisk,
                           **self._settings())
            _check_budget(cache, self.directory)
        except BaseException as exc:
            # diskcache opened its connection before failing: close it, or every failed open
            # leaks a descriptor until the garbage collector finds the half-made cache.
            with contextlib.suppress(Exception):
                cache.close()
            if isinstance(exc, TierUnavailable):
                raise
            if isinstance(exc, (TypeError, ValueError, KeyError, AttributeError)):
                # diskcache applies every row of its Settings table as an option: a planted
                # or damaged row fails here.
                raise TierUnavailable(f"damaged settings in {self.directory / INDEX}: "
                                      f"{type(exc).__name__}: {exc}") from None
            if isinstance(exc, (OSError, sqlite3.Error)):
                raise TierUnavailable(f"cannot open {self.directory}: {type(exc).__name__}: "
                                      f"{exc}") from exc
            raise
        return cache

    def _settings(self) -> dict[str, object]:
        settings: dict[str, object] = {
            "eviction_policy": "least-recently-used",
            "cull_limit": 0,  # eviction is ours (see module docstring)
            "statistics": 1,  # persistent hit/miss counts, shown by `blendrag cache stats`
            "disk_min_file_size": 0,  # every entry is a file: one layer can be read alone
        }
        if self._budget is not None:
            settings["size_limit"] = self._budget
        return settings

    def _tidy_up(self, cache: diskcache.Cache) -> None:
        """Remove the entry files no row references and evict what exceeds the budget. Best
        effort: a failure (no descriptor left, the lock held elsewhere) is logged, and the
        next open tries again."""
        try:
            orphans = unreferenced(cache, entry_files(self.directory))
            for name in orphans:
                cache.disk.remove(name)
            with cache.transact():
                self._evict_to(cache, self._limit(cache))
        except self.errors as exc:
            log.warning("KV store: could not tidy %s (%s: %s); the next open tries again",
                        self.label, type(exc).__name__, exc)
            return
        if orphans:
            log.warning("KV store: removed %d entry files that no index row of %s referenced",
                        len(orphans), self.label)

    def _limit(self, cache: diskcache.Cache) -> int:
        return self._budget if self._budget is not None else int(cache.size_limit)

    @property
    def budget_bytes(self) -> int:
        return self._limit(self.open())

    def unusable(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the disk as a whole cannot be used now (it fails to open, is
        read-only or full, or another process holds the lock past the timeout), rather than
        that one operation failed (descriptors, I/O, permissions on one file)."""
        if isinstance(exc, (TierUnavailable, diskcache.Timeout)):
            return True
        if isinstance(exc, sqlite3.Error):
            return not any(m in str(exc).lower() for m in _TRANSIENT_SQLITE)
        if isinstance(exc, OSError) and exc.errno in _DISK_DOWN:
            return True
        return not transient_os_error(exc)

    def fetch(self, key: str) -> bytes | BinaryIO | None:
        """An open handle on the entry file (marks it most recently used), or None."""
        cache = self.open()
        try:
            return cache.get(key, read=True)
        except UnreadableFile as exc:
            raise exc.error from None

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data``, evicting LRU entries first; False when it cannot fit the budget."""
        cache = self.open()
        budget = self._limit(cache)
        if len(data) + self._index_bytes(cache) > budget:
            return False
        try:
            # The entry's folders opened first: a planted symlink refuses the write before an
            # entry is evicted to make room for it.
            with cache.disk.writing():
                # The file is written while the write lock is held: an orphan scan under the
                # lock (disk_files.unreferenced) never takes a file of ours about to get its row.
                with cache.transact():
                    self._evict_to(cache, budget - len(data) - _INDEX_GROWTH)
                    cache.set(key, data)
                    self._evict_to(cache, budget)
        except UnsafeFolder as exc:
            log.error("KV store: write of %s to %s refused: %s (nothing written outside the "
                      "store; remove the link to store entries again)", key, self.label, exc)
            return False
        return True

    def contains(self, key: str) -> bool:
        """True when present; does not count as a use."""
        return key in self.open()

    def delete(self, key: str) -> None:
        self.open().delete(key)

    def clear(self, namespace_id: str = "") -> None:
        """Every entry of the namespace removed, with the files no row references."""
        cache = self.open()
        for key in list(cache.iterkeys()):
            if isinstance(key, str) and split(key)[0] == namespace_id:
                cache.delete(key)
        for name in unreferenced(cache, entry_files(self.directory)):
            cache.disk.remove(name)

    def usage(self) -> TierUsage:
        cache = self.open()
        return TierUsage(entries=len(cache), used_bytes=cache.volume(),
                         budget_bytes=self._limit(cache))

    def keys(self) -> list[str]:
        """Every key stored (a walk of the index: for tools and tests, not the request path)."""
        return [str(key) for key in self.open().iterkeys()]

    def lifetime_counts(self) -> tuple[int, int]:
        """(hits, misses) over every process that used this directory."""
        cache = self.open()
        return int(cache.reset("hits")), int(cache.reset("misses"))

    def entry_path(self, key: str) -> Path | None:
        """Path of the entry file (marks it used); for tools and tests."""
        handle = self.fetch(key)
        if handle is None or isinstance(handle, bytes):
            return None
        with handle:
            return Path(handle.name)

    def close(self) -> None:
        with self._open_lock:
            self._close()

    def _close(self) -> None:
        if self._cache is not None:
            self._cache.close()
            self._cache = None

    @staticmethod
    def _index_bytes(cache: diskcache.Cache) -> int:
        return cache.volume() - int(cache.reset("size"))

    @staticmethod
    def _evict_to(cache: diskcache.Cache, limit: int) -> None:
        # One least-recently-used entry at a time (diskcache's cull() drops ten at once).
        # Reads diskcache's own Cache table, ordered by the column its LRU policy maintains.
        while cache.volume() > limit:
            row = cache._sql(_LRU_ENTRY).fetchone()
            if row is None or not cache.delete(row[0]):
                return


def _check_budget(cache: diskcache.Cache, directory: Path) -> None:
    if not isinstance(cache.size_limit, int) or cache.size_limit <= 0:
        raise TierUnavailable(f"damaged settings in {directory / INDEX}: size_limit "
                              f"{cache.size_limit!r}")
