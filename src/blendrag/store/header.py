"""An entry's safetensors header read as untrusted bytes: its length checked, its nesting depth
measured on the raw bytes, then parsed by a JSON parser that refuses every value a tensor
cannot have; refusals remembered (``Refusals``) so that a refused header is not parsed again.

Anyone who can write a tier writes these bytes: a header may hold ``1e999``, ``NaN``,
``10**40``, a million nested brackets or 100 MiB of text. Every such value is an
``EntryError`` here (a counted miss), never an ``OverflowError``, ``RecursionError`` or
``MemoryError`` that would fail the request reading it. A safetensors header holds objects,
arrays, strings and non-negative integers only: no float, no constant, no number beyond
``MAX_INT``, nothing nested deeper than ``MAX_DEPTH`` (the entry's metadata holds JSON text of
its own, parsed by ``loads`` as well).

The same entries are opened again and again (the same passages come back), and the checks cost
seven times the parse (a 32-layer entry of 512 tokens: 1.2 ms against 0.18 a header and its
three metadata texts). A text that passed them is remembered by its exact bytes (``Accepted``):
the same text parses to the same values, so it is parsed again by the plain parser, with no
check left out: nothing but an equal text is ever taken for it (no digest, no collision).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import xxhash

from blendrag.store.errors import AuthError, EntryError
from blendrag.store.readers import RangeReader

MAX_HEADER = 100 << 20  # the safetensors limit
# A written header is at most a few hundred bytes per tensor (each of at least one byte of
# data) and 13 per token id (each token at least two bytes of K and V): past this, the header
# cannot describe the data after it.
HEADER_SLACK = 1 << 20
HEADER_PER_DATA_BYTE = 256
MAX_DEPTH = 8  # a safetensors header nests 3 deep; the metadata's JSON texts 2
MAX_INT = (1 << 63) - 1  # no size, offset or token id of a real entry is larger
_MAX_DIGITS = len(str(MAX_INT))
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"\\[]{}/bfnrtu'))
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)
_CLOSE = np.frombuffer(b"]}", dtype=np.uint8)
REFUSED_HEADERS = 4096  # refused headers remembered (digests: 16 bytes each)
ACCEPTED_BYTES = 16 << 20  # memory the accepted JSON texts remembered take (``Accepted``)


def read_raw(reader: RangeReader) -> bytes:
    """The header bytes of the entry under ``reader``, their length checked against the entry's
    size and the header caps; ``EntryError`` when it cannot be a header."""
    head = reader.read(0, 8)
    if len(head) < 8:
        raise EntryError("truncated: shorter than a safetensors header")
    n = int.from_bytes(head, "little")
    data_len = reader.size - 8 - n
    if n > min(MAX_HEADER, reader.size - 8):
        raise EntryError(f"truncated or malformed: header length {n} for {reader.size} bytes")
    if n > HEADER_SLACK + HEADER_PER_DATA_BYTE * data_len:
        raise EntryError(f"a header of {n} bytes for {data_len} bytes of data")
    raw = reader.read(8, n)
    if len(raw) < n:
        raise EntryError("truncated in the header")
    return raw


def digest(raw: bytes, size: int, key: str) -> bytes:
    """What a refusal of header ``raw`` is remembered by: xxh3-128 (tens of GB/s) of the header,
    the entry's ``size`` and its storage ``key`` (what a refusal may depend on besides the
    payload, which no header check reads)."""
    h = xxhash.xxh3_128()
    h.update(raw)
    h.update(size.to_bytes(8, "little") + key.encode())
    return h.digest()


def check_depth(raw: bytes | str) -> None:
    """``EntryError`` when JSON text ``raw`` nests deeper than ``MAX_DEPTH`` (strings left out),
    measured before any parser recurses into it."""
    data = raw.encode() if isinstance(raw, str) else raw
    # only what delimits strings and nesting is kept (and what may follow a backslash), so the
    # string pattern runs over far fewer bytes than a large header's text
    structure = data.translate(None, _NOT_STRUCTURE)
    bare = np.frombuffer(_STRING.sub(b"", structure), dtype=np.uint8)
    steps = np.isin(bare, _OPEN).astype(np.int64) - np.isin(bare, _CLOSE).astype(np.int64)
    if steps.size and int(np.cumsum(steps).max()) > MAX_DEPTH:
        raise EntryError(f"header nested deeper than {MAX_DEPTH}")


def _refuse_constant(name: str) -> Any:
    raise EntryError(f"header holds {name}: no tensor has it")


def _refuse_float(text: str) -> Any:
    raise EntryError(f"header holds the number {text[:24]}: sizes and offsets are integers")


def _bounded_int(text: str) -> int:
    value = int(text) if len(text) <= _MAX_DIGITS + 1 else MAX_INT + 1
    if abs(value) > MAX_INT:
        raise EntryError(f"header holds the integer {text[:24]}…: beyond any tensor")
    return value


def loads(raw: bytes | str) -> Any:
    """JSON text ``raw`` parsed strictly (module docstring); ``EntryError`` for anything else,
    whatever the parser would raise. A text accepted before is parsed without the checks it
    passed (``ACCEPTED``): the values are the same, fresh ones the caller may change."""
    if not isinstance(raw, (bytes, str)):  # a bytearray: not remembered (it may change)
        return _strict(raw)
    if ACCEPTED.holds(raw):
        return json.loads(raw)
    value = _strict(raw)
    ACCEPTED.add(raw)
    return value


def _strict(raw: bytes | str) -> Any:
    check_depth(raw)
    try:
        return json.loads(raw, parse_constant=_refuse_constant, parse_float=_refuse_float,
                          parse_int=_bounded_int)
    except EntryError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise EntryError(f"header is not JSON: {str(exc)[:200]}") from None
    except Exception as exc:  # noqa: BLE001 - attacker bytes: nothing they raise fails a read
        raise EntryError(f"header does not parse: {type(exc).__name__}") from None


class Refusals:
    """Refused headers remembered by digest, at most ``size`` (the least recently refused go
    first): a header refused once is refused again without being parsed. Only what the bytes
    alone decide is remembered; a refusal that depends on more (the storage key, the keys) is
    remembered under a digest that includes it, by whoever holds that more (``StoreKeys``)."""

    def __init__(self, size: int = REFUSED_HEADERS) -> None:
        self._size = size
        self._seen: OrderedDict[bytes, tuple[type[EntryError], str, bool]] = OrderedDict()
        self._lock = threading.Lock()  # entries are read from many threads at once

    def check(self, key: bytes) -> None:
        """Raise again (a fresh error of the same kind) what ``key``'s header was refused for,
        if it was."""
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                return
            self._seen.move_to_end(key)
        kind, message, retired = seen
        if issubclass(kind, AuthError):
            raise AuthError(message, retired=retired)
        raise kind(message)

    def add(self, key: bytes, error: EntryError) -> None:
        # the kind and message only: the error itself holds its traceback, whose frames hold
        # the reader (an open file) and the store
        retired = isinstance(error, AuthError) and error.retired
        with self._lock:
            self._seen[key] = (type(error), str(error), retired)
            self._seen.move_to_end(key)
            while len(self._seen) > self._size:
                self._seen.popitem(last=False)

    def __len__(self) -> int:
        return len(self._seen)


class Accepted:
    """JSON texts that passed ``loads``' checks, remembered by their exact bytes (a set: a text
    is found only by an equal one), at most ``max_bytes`` of memory in all (each text's object
    and its place in the order: ``held``), the least recently used forgotten first; a text
    that takes more than a quarter of that is not remembered. Texts that pass the parse may
    still be refused by what reads them (a shape, a token id): whoever writes a tier can fill
    this with texts of its own, and the bound holds for them too."""

    def __init__(self, max_bytes: int = ACCEPTED_BYTES) -> None:
        self.max_bytes = max_bytes
        self._texts: OrderedDict[bytes | str, None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # entries are opened from many threads at once

    def holds(self, raw: bytes | str) -> bool:
        """Whether ``raw`` passed the checks before (it is then the most recently used)."""
        with self._lock:
            if raw not in self._texts:
                return False
            self._texts.move_to_end(raw)
            return True

    def add(self, raw: bytes | str) -> None:
        size = held(raw)
        if 4 * size > self.max_bytes:
            return
        with self._lock:
            if raw in self._texts:
                return
            self._texts[raw] = None
            self._bytes += size
            while self._bytes > self.max_bytes:
                old, _ = self._texts.popitem(last=False)
                self._bytes -= held(old)

    def __len__(self) -> int:
        return len(self._texts)


def held(raw: bytes | str) -> int:
    """Memory text ``raw`` takes when remembered: its object (a str of wide characters takes
    several bytes each) and its node in the order (about ``ORDER_NODE_BYTES``)."""
    return sys.getsizeof(raw) + ORDER_NODE_BYTES


ORDER_NODE_BYTES = 160  # an OrderedDict entry: its table slots and linked-list node (measured)
ACCEPTED = Accepted()  # shared by every store of the process, as ``tensors.REFUSED`` is
