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
- Writes and removals never follow a link out of the store: the entry's folders are opened one
  at a time from the store folder's descriptor with O_NOFOLLOW | O_DIRECTORY, and the file is
  created in the last one with O_EXCL | O_NOFOLLOW (``EntryFolders``). A folder that is a
  symlink (or not a folder) is ``UnsafeFolder``: the write is refused, nothing is removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
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
# What opening a folder with O_NOFOLLOW | O_DIRECTORY fails with when it is a symlink or a file.
_NOT_A_FOLDER = frozenset({errno.ELOOP, errno.ENOTDIR})
_CLOEXEC, _NOFOLLOW = getattr(os, "O_CLOEXEC", 0), getattr(os, "O_NOFOLLOW", 0)
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC | _NOFOLLOW


class UnsafeFolder(Exception):
    """An entry's folder (or its name) in the store is a symlink or not a folder: no entry file
    is written or removed through it."""


class EntryFolders:
    """Descriptors of the store folder and of an entry's folders under it (``ab``, ``ab/cd``),
    each opened from the one above with O_NOFOLLOW: what is created or removed through them
    stays inside the store whatever was planted since. Closed by ``close``."""

    def __init__(self, directory: str, folders: list[str], create: bool) -> None:
        self.fds = [os.open(directory, _FOLDER_FLAGS)]  # the store folder itself, as configured
        try:
            for name in folders:
                if create:
                    with contextlib.suppress(FileExistsError):  # a symlink too: opened below
                        os.mkdir(name, 0o755, dir_fd=self.fds[-1])
                self.fds.append(_open_folder(name, self.fds[-1]))
        except BaseException:
            self.close()
            raise

    @property
    def leaf(self) -> int:
        return self.fds[-1]

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []


def _open_folder(name: str, parent: int) -> int:
    try:
        return os.open(name, _FOLDER_FLAGS | _NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno in _NOT_A_FOLDER:
            raise UnsafeFolder(f"store folder {name!r} is a symlink or not a folder") from None
        raise


def _parts(filename: str) -> tuple[list[str], str]:
    """(folders, file name) of an index row's relative filename; UnsafeFolder for a name that
    could leave the folder it is joined to (absolute, ``..``, empty parts)."""
    parts = str(filename).split(os.sep)
    if os.path.isabs(filename) or any(p in ("", ".", "..") for p in parts):
        raise UnsafeFolder(f"index row names a file outside the store: {filename!r}")
    return parts[:-1], parts[-1]


class UnreadableFile(Exception):
    """An entry file that could not be opened for a reason outside its bytes (``error``)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class BytesOnlyDisk(diskcache.Disk):
    """diskcache serializer that accepts str keys and bytes values only, and never unpickles.

    ``DiskTier.put`` opens the folders of its next entry file first (``writing``), so that a
    planted symlink refuses the write before any entry is evicted to make room for it."""

    def __init__(self, directory, min_file_size=0, pickle_protocol=0):
        super().__init__(directory, min_file_size, pickle_protocol)
        self._next = threading.local()  # this thread's opened folders and file name, if any

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """The folders of this thread's next entry file opened now (``UnsafeFolder`` when one is
        a symlink), and closed after."""
        hex_name = secrets.token_hex(16)
        folders = [hex_name[:2], hex_name[2:4]]
        opened = EntryFolders(self._directory, folders, create=True)
        if _exists(hex_name[4:] + ".val", opened.leaf):
            opened.close()
            raise UnsafeFolder(f"entry file {hex_name[4:]}.val already exists in the store")
        self._next.entry = (os.path.join(*folders, hex_name[4:] + ".val"), opened)
        try:
            yield
        finally:
            self._next.entry = None
            opened.close()

    def filename(self, key=diskcache.core.UNKNOWN, value=diskcache.core.UNKNOWN):
        entry = getattr(self._next, "entry", None)
        if entry is None:
            return super().filename(key, value)
        return entry[0], os.path.join(self._directory, entry[0])

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
            value = super().fetch(mode, filename, value, read)
            if type(value) is not bytes:  # an int or a float planted by plain diskcache calls
                log.warning("KV cache index row holding %s refused (only bytes are read)",
                            type(value).__name__)
                raise OSError("refused non-bytes cache row")
            return value
        # EntryError passes through diskcache: the store drops the row as an unusable entry.
        handle = open_regular(self.inside(filename))
        if read:
            return handle
        with handle:
            return handle.read()

    def remove(self, file_path):
        """Remove an entry file and its folders once empty, through folder descriptors opened
        with O_NOFOLLOW (never a file outside the store); failures are ignored, as diskcache
        does (another process may have removed it first)."""
        try:
            self.inside(file_path)
            folders, name = _parts(file_path)
            opened = EntryFolders(self._directory, folders, create=False)
        except (EntryError, UnsafeFolder) as exc:
            log.warning("KV cache index row names %r: not removed (%s)", file_path, exc)
            return
        except OSError:
            return  # its folder is gone: so is the file
        try:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=opened.leaf)
            for depth in range(len(folders), 0, -1):  # empty folders, deepest first
                with contextlib.suppress(OSError):
                    os.rmdir(folders[depth - 1], dir_fd=opened.fds[depth - 1])
        finally:
            opened.close()

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
        if mode != "xb":
            raise TypeError(f"disk tier files are written as bytes, not in mode {mode!r}")
        filename = os.path.relpath(full_path, self._directory)
        folders, name = _parts(filename)
        entry = getattr(self._next, "entry", None)
        own = entry is None or entry[0] != filename
        opened = EntryFolders(self._directory, folders, create=True) if own else entry[1]
        try:
            return _write_new(opened.leaf, name, iterator)
        except OSError:  # a full disk leaves a partial file that no index row points to
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=opened.leaf)
            raise
        finally:
            if own:
                opened.close()


def _exists(name: str, folder: int) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_new(folder: int, name: str, iterator) -> int:
    """Create ``name`` in the folder ``folder`` (never through a symlink, never over a file) and
    write the chunks of ``iterator`` (the caller removes what a failure leaves)."""
    try:
        fd = os.open(name, _NEW_FILE_FLAGS, 0o644, dir_fd=folder)
    except FileExistsError:  # a random name taken: planted, as a symlink or a file
        raise UnsafeFolder(f"entry file {name!r} already exists in the store") from None
    with os.fdopen(fd, "wb") as writer:
        return sum(writer.write(chunk) for chunk in iterator)


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
