"""Positioned reads of one stored entry: ``RangeReader``, what the codec reads an entry through,
and its readers of an entry file and of an entry held in memory (the Redis and S3 tiers bring
their own: ``redis_tier.RedisRanges``, ``s3_ranges.S3Ranges``).

What a reader can do beyond positioned reads is declared on its class, never probed:
``concurrent_reads`` (several threads may read at once: an entry file's layers are read ahead
by a pool, ``layered.py``) and ``fetches_ahead`` (``read_ahead`` starts fetching the spans it is
told: S3, whose every request costs a round trip).
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO, ClassVar

from blendrag.store.errors import EntryError


def _iov_max() -> int:
    """Buffers one ``preadv`` may take (IOV_MAX, 1024 on Linux)."""
    try:
        return max(1, min(1024, os.sysconf("SC_IOV_MAX")))
    except (AttributeError, ValueError, OSError):
        return 16


IOV_MAX = _iov_max()


class RangeReader(ABC):
    """Positioned reads of one stored entry of ``size`` bytes (a tier's layer-wise source).
    ``read_into_many`` fills the buffers in order from ``offset`` and returns the bytes read,
    fewer only at the end of the entry. A storage failure raises one of the tier's errors;
    bytes that cannot be the entry's raise ``EntryError``."""

    size: int
    # Positioned reads from several threads at once are safe (layers may be read ahead).
    concurrent_reads: ClassVar[bool] = False
    # ``read_ahead`` fetches the spans it is told in the background: worth announcing them.
    fetches_ahead: ClassVar[bool] = False

    @abstractmethod
    def read(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` (fewer only at the end of the entry)."""

    @abstractmethod
    def read_into_many(self, offset: int, bufs: list[memoryview]) -> int:
        """Fill ``bufs`` in order from ``offset``; the bytes read."""

    def read_ahead(self, spans: list[list[tuple[int, int]]]) -> None:
        """Told the absolute [start, end) byte spans of each layer (``spans[i]``: layer i), in
        the order they will be read; a reader that ``fetches_ahead`` starts fetching them.
        Here nothing: each read is made when asked for."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release what the reader holds (a file, fetches under way)."""


def scatter(data: bytes, bufs: list[memoryview]) -> int:
    """Copy ``data`` into ``bufs`` in order (a ``RangeReader.read_into_many`` over a source
    that returns bytes); the bytes copied, fewer when ``data`` ends early."""
    done = 0
    for buf in bufs:
        part = data[done:done + len(buf)]
        buf[:len(part)] = part
        done += len(part)
        if len(part) < len(buf):
            break
    return done


def reader_of(source: bytes | bytearray | memoryview | BinaryIO) -> RangeReader:
    """Positioned reads on an entry fetched whole: its bytes, or an open entry file (closed with
    the reader, or at once when it is not a readable regular file)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return BufferReader(source)
    return file_reader(source)


def file_reader(handle: BinaryIO) -> FileReader:
    """Positioned reads on an open entry file (the disk tier's layer-wise source); closing the
    reader closes ``handle``, and so does a failure to make the reader."""
    try:
        reader = FileReader(handle)
    except BaseException:
        handle.close()
        raise
    reader.handle = handle
    return reader


class BufferReader(RangeReader):
    """Positioned reads from an entry held in memory (a whole Redis or S3 value)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = memoryview(data).cast("B")
        self.size = len(self._data)

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self._data[offset : offset + n])

    def read_into_many(self, offset: int, bufs: list[memoryview]) -> int:
        done = 0  # copies in place, without the copy scatter() starts from
        for buf in bufs:
            chunk = self._data[offset + done : offset + done + len(buf)]
            buf[: len(chunk)] = chunk
            done += len(chunk)
            if len(chunk) < len(buf):
                break
        return done

    def close(self) -> None:
        self._data = memoryview(b"")


class FileReader(RangeReader):
    """Positioned reads (pread) from an entry file, by path or on a caller's open handle.

    A file that cannot be opened or read (no descriptor left, an I/O error, no permission)
    raises its ``OSError``: that says nothing about the entry's bytes, so it is not an
    ``EntryError`` (which would get a valid entry deleted). A short read is one: the file holds
    fewer bytes than its header declares. ``pread`` keeps no file position: reads from several
    threads at once are safe."""

    concurrent_reads = True

    def __init__(self, source: str | Path | BinaryIO) -> None:
        self.handle: BinaryIO | None = None  # a handle handed over by ``file_reader``
        self._owned = isinstance(source, (str, Path))
        self._fd = -1
        try:
            # O_NONBLOCK: opening a FIFO planted in place of an entry must not block
            self._fd = (os.open(source, os.O_RDONLY | os.O_NONBLOCK)
                        if isinstance(source, (str, Path)) else source.fileno())
            st = os.fstat(self._fd)
        except BaseException:
            self.close()
            raise
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise EntryError("entry is not a regular file")
        self.size = st.st_size

    def read(self, offset: int, n: int) -> bytes:
        # pread: one buffer, filled once (a zeroed bytearray copied out costs three passes
        # over a large header)
        parts = []
        while n > 0:
            part = os.pread(self._fd, n, offset)  # OSError: a storage failure
            if not part:
                break  # end of file: the caller sees a short read
            parts.append(part)
            offset, n = offset + len(part), n - len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_into_many(self, offset: int, bufs: list[memoryview]) -> int:
        """Fill ``bufs`` in order from ``offset`` (scatter reads); returns the bytes read, fewer
        only at the end of the file."""
        done, pending = 0, [b for b in bufs if len(b)]
        while pending:
            got = os.preadv(self._fd, pending, offset + done)  # OSError: a storage failure
            if got == 0:
                break  # end of file: the caller sees a short read
            done += got
            pending = _advance(pending, got)
        return done

    def close(self) -> None:
        if self._owned and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def _advance(bufs: list[memoryview], n: int) -> list[memoryview]:
    """``bufs`` less their first ``n`` bytes (after a partial scatter read)."""
    while bufs and n >= len(bufs[0]):
        n -= len(bufs[0])
        bufs = bufs[1:]
    if bufs and n:
        bufs = [bufs[0][n:], *bufs[1:]]
    return bufs
