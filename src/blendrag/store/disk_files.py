"""The disk tier's files: how an entry file is opened and removed, and which files no index row
references.

diskcache keeps one file per entry next to its SQLite index (``cache.db``). Three things are
added here:

- ``BytesOnlyDisk``: no pickle on the read path (diskcache unpickles any row whose mode says
  "pickle", so a tampered index could run code) and no file outside the store (diskcache joins
  a row's filename to the directory, so an absolute or ``..`` filename would be read, and
  deleted with its empty parent folders when the entry is dropped). Only regular files inside
  the directory are opened and removed (a FIFO would block the reader forever); any other row
  is an unusable entry, dropped as such.
- A file that cannot be opened for a reason that says nothing about its bytes (no descriptor
  left, an I/O error, no permission) is a storage failure, not an unusable entry: it is
  carried through diskcache as ``UnreadableFile`` (diskcache would turn an ``OSError`` into a
  silent miss), and ``DiskTier`` raises the ``OSError`` again.
- ``unreferenced``: the entry files no index row references (left by a writer killed between
  writing the file and committing its row, or by an index that was removed), which the disk
  tier removes when it opens.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

import diskcache
from diskcache.core import MODE_BINARY, MODE_RAW

from blendrag.store.errors import EntryError

log = logging.getLogger("blendrag.store")

INDEX = "cache.db"
# The names diskcache gives entry files and their folders (``ab/cd/<hex>.val``).
_HEX_FOLDER = re.compile(r"[0-9a-f]{2}")
_ENTRY_FILE = re.compile(r"[0-9a-f]+\.val")
# What opening a path that is not a regular file fails with under O_NOFOLLOW | O_NONBLOCK: a
# symlink (ELOOP), a socket (ENXIO), a folder (EISDIR is not raised for O_RDONLY; fstat finds
# it). They are facts about the entry, not failures of the disk.
_NOT_A_FILE = frozenset({errno.ELOOP, errno.ENXIO})


class UnreadableFile(Exception):
    """An entry file that could not be opened for a reason outside its bytes (``error``)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class BytesOnlyDisk(diskcache.Disk):
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
        handle = open_regular(self.inside(filename))
        if read:
            return handle
        with handle:
            return handle.read()

    def remove(self, file_path):
        try:
            self.inside(file_path)
        except EntryError as exc:
            log.warning("KV cache index row names %r: not removed (%s)", file_path, exc)
            return
        super().remove(file_path)

    def inside(self, filename) -> str:
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


def open_regular(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file only: O_NONBLOCK so that a FIFO cannot block the
    open, O_NOFOLLOW so that a planted symlink is not followed. A file that is not regular is
    an ``EntryError``; one that cannot be opened for another reason is ``UnreadableFile``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise  # evicted by another process a moment ago: diskcache makes it a miss
    except OSError as exc:
        if exc.errno in _NOT_A_FILE:
            raise EntryError(f"entry path is not a regular file: {exc}") from None
        raise UnreadableFile(exc) from None
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


def index_identity(directory: Path) -> tuple[int, int] | None:
    """(device, inode) of the index file now; None when it is gone. Removing the index under a
    running process, or replacing it, changes this: that process's connection still writes to
    the old, unlinked file, which no other process sees."""
    try:
        st = os.stat(directory / INDEX)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def entry_files(directory: Path) -> list[str]:
    """Paths, relative to ``directory``, of the regular entry files in diskcache's two levels of
    folders (``ab/cd/<hex name>.val``): only names diskcache makes, so a file of the user's that
    happens to sit in the folder is never taken for an orphan entry."""
    found: list[str] = []
    for top in _folders(directory):
        for sub in _folders(Path(top.path)):
            with contextlib.suppress(FileNotFoundError), os.scandir(sub.path) as files:
                found += [os.path.join(top.name, sub.name, f.name) for f in files
                          if _ENTRY_FILE.fullmatch(f.name) and f.is_file(follow_symlinks=False)]
    return found


def _folders(path: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as entries:
            return [e for e in entries
                    if _HEX_FOLDER.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def unreferenced(cache: diskcache.Cache, listed: list[str]) -> list[str]:
    """The files of ``listed`` (made by ``entry_files`` before this call) that no index row
    references. The rows are read under the index's write lock: every writer of the disk tier
    writes its file while holding that lock (``DiskTier.put``), so a file listed before it
    whose row is not committed once the lock is ours belongs to a writer that died."""
    with cache.transact():
        rows = cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()
    known = {os.path.normpath(str(name)) for (name,) in rows}
    return [f for f in listed if os.path.normpath(f) not in known]
