"""Disk tier: a diskcache directory, bounded in bytes, least-recently-used eviction.

diskcache gives the process safety (SQLite index in WAL mode, one file per entry, writers
serialized by the database lock). Two things it does not give are added here:

- a hard byte budget: its own cull runs after the insert and removes up to ``cull_limit``
  rows, so the cache can sit above ``size_limit``, and ``cull()`` evicts in batches of ten.
  ``put`` therefore evicts least-recently-used entries one at a time *before* writing, inside
  the same transaction as the insert, so no process ever sees the budget exceeded;
- no pickle on the read path: diskcache unpickles any row whose mode says "pickle", so a
  tampered index could run code. ``_BytesOnlyDisk`` stores and returns bytes only;
- no file outside the store: diskcache joins a row's filename to the directory, so an absolute
  or ``..`` filename would be read, and deleted with its empty parent folders when the entry is
  dropped. ``_BytesOnlyDisk`` opens and removes only regular files inside the directory (a FIFO
  would block the reader forever); any other row is an unusable entry, dropped as such.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import BinaryIO

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW

from blendrag.store.codec import EntryError
from blendrag.store.protocol import TierUsage

log = logging.getLogger("blendrag.store")

# Index pages a new row may add (a few 4 KiB SQLite pages); reserved before the insert.
_INDEX_GROWTH = 16 << 10
# The least recently used entry, in diskcache's own table and by the column its LRU policy keeps.
_LRU_ENTRY = "SELECT key FROM Cache WHERE raw = 1 ORDER BY access_time LIMIT 1"


class _BytesOnlyDisk(diskcache.Disk):
    """diskcache serializer that accepts str keys and bytes values only, and never unpickles."""

    def put(self, key):
        if type(key) is not str:
            raise TypeError(f"disk tier keys are str, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise ValueError("refusing a pickled key in the KV cache index")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if type(value) is not bytes:
            raise TypeError(f"disk tier values are bytes, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode not in (MODE_RAW, MODE_BINARY):
            log.warning("KV cache index row with mode %s refused (only raw bytes are read)", mode)
            raise OSError("refused non-bytes cache row")  # diskcache turns OSError into a miss
        if mode == MODE_RAW:
            return super().fetch(mode, filename, value, read)
        # EntryError passes through diskcache: the store drops the row as an unusable entry.
        handle = _open_regular(self._inside(filename))
        if read:
            return handle
        with handle:
            return handle.read()

    def remove(self, file_path):
        try:
            self._inside(file_path)
        except EntryError as exc:
            log.warning("KV cache index row names %r: not removed (%s)", file_path, exc)
            return
        super().remove(file_path)

    def _inside(self, filename) -> str:
        """The full path of an index row's file; EntryError unless it lies inside the store."""
        root = os.path.realpath(self._directory)
        if not isinstance(filename, str) or os.path.isabs(filename):
            raise EntryError(f"index row names a file outside the store: {filename!r}")
        full = os.path.realpath(os.path.join(root, filename))
        if os.path.commonpath([root, full]) != root or full == root:
            raise EntryError(f"index row names a file outside the store: {filename!r}")
        return full

    def _write(self, full_path, iterator, mode, encoding=None):
        # A full disk leaves a partial file that no index row points to: remove it.
        try:
            return super()._write(full_path, iterator, mode, encoding)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(full_path)
            raise


def _open_regular(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file only: O_NONBLOCK so that a FIFO cannot block the
    open, O_NOFOLLOW so that a planted symlink is not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise  # evicted by another process a moment ago: diskcache makes it a miss
    except OSError as exc:
        raise EntryError(f"cannot open entry file: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EntryError("entry path is not a regular file")
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb")
        handle.raw.name = path  # type: ignore[attr-defined]  # as open(path) names it
        return handle
    except BaseException:
        os.close(fd)
        raise


class DiskTier:
    """Byte tier on a diskcache directory, shared by every process that opens it.

    ``budget_bytes`` bounds the index plus the entry files (``diskcache.Cache.volume()``);
    None keeps the budget stored in the directory (used by the CLI, which only inspects).
    """

    name = "disk"
    errors: tuple[type[BaseException], ...] = (OSError, sqlite3.Error, diskcache.Timeout)

    def __init__(self, directory: str | Path, budget_bytes: int | None,
                 timeout_s: float = 10.0) -> None:
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"DiskTier budget_bytes must be positive, got {budget_bytes}")
        self.directory = Path(directory)
        self._budget = budget_bytes
        self._timeout_s = timeout_s
        self._cache: diskcache.Cache | None = None
        self._open_lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"disk tier at {self.directory}"

    def open(self) -> diskcache.Cache:
        """Open (creating if needed) the cache directory; raises on a read-only/absent disk."""
        with self._open_lock:
            return self._open()

    def _open(self) -> diskcache.Cache:
        if self._cache is None:
            settings = {
                "eviction_policy": "least-recently-used",
                "cull_limit": 0,  # eviction is ours (see module docstring)
                "statistics": 1,  # persistent hit/miss counts, shown by `blendrag cache stats`
                "disk_min_file_size": 0,  # every entry is a file: one layer can be read alone
            }
            if self._budget is not None:
                settings["size_limit"] = self._budget
            try:
                cache = diskcache.Cache(str(self.directory), timeout=self._timeout_s,
                                        disk=_BytesOnlyDisk, **settings)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                # diskcache applies every row of its Settings table as an option: a planted or
                # damaged row fails here. An OSError benches the tier like any unusable disk.
                raise OSError(f"damaged settings in {self.directory / 'cache.db'}: "
                              f"{type(exc).__name__}: {exc}") from None
            if not isinstance(cache.size_limit, int) or cache.size_limit <= 0:
                cache.close()
                raise OSError(f"damaged settings in {self.directory / 'cache.db'}: size_limit "
                              f"{cache.size_limit!r}")
            self._cache = cache
        return self._cache

    @property
    def budget_bytes(self) -> int:
        return self._budget if self._budget is not None else int(self.open().size_limit)

    def fetch(self, key: str) -> bytes | BinaryIO | None:
        """An open handle on the entry file (marks it most recently used), or None."""
        return self.open().get(key, read=True)

    def put(self, key: str, data: bytes) -> bool:
        """Store ``data``, evicting LRU entries first; False when it cannot fit the budget."""
        cache = self.open()
        budget = self.budget_bytes
        if len(data) + self._index_bytes(cache) > budget:
            return False
        with cache.transact():
            self._evict_to(cache, budget - len(data) - _INDEX_GROWTH)
            cache.set(key, data)
            self._evict_to(cache, budget)
        return True

    def contains(self, key: str) -> bool:
        """True when present; does not count as a use."""
        return key in self.open()

    def delete(self, key: str) -> None:
        self.open().delete(key)

    def clear(self) -> None:
        self.open().clear()

    def usage(self) -> TierUsage:
        cache = self.open()
        return TierUsage(entries=len(cache), used_bytes=cache.volume(),
                         budget_bytes=self.budget_bytes)

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
