"""The tensors of one stored entry: its safetensors header, strictly checked, over a
``RangeReader``, and positioned reads of its tensors into the caller's memory
(``entry_reader.py`` reads entries through it).

Why not ``safetensors.safe_open``: it memory-maps the file, and a file truncated while mapped
kills the process with SIGBUS. Positioned reads turn that into a short read, i.e. an
``EntryError``, and read exactly one tensor's bytes. Writing still uses safetensors.

The header is untrusted until checked: its length against the entry's size, then (with store
keys) its tag over the raw bytes (``signed_header.py``), then a strict parse (``header.py``),
then every tensor's dtype, shape and offsets against the data. A header refused is remembered
(``REFUSED``, ``StoreKeys.refusals``) and refused again without being parsed.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from blendrag.store import header as headers
from blendrag.store import signed_header
from blendrag.store.auth import StoreKeys
from blendrag.store.errors import AuthError, EntryError
from blendrag.store.readers import IOV_MAX, RangeReader

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I8": torch.int8}

# Headers refused (not JSON, too deep, impossible numbers, a damaged tag, metadata that cannot
# be the entry's), by digest of the header bytes, the entry's size and the storage key: not
# parsed again while remembered. Refusals by the keys are remembered by the keys.
REFUSED = headers.Refusals()


def remember(seen: bytes, exc: EntryError, keys: StoreKeys | None) -> None:
    """Remember the refusal ``exc`` of the header whose digest is ``seen`` (``REFUSED``; an
    ``AuthError`` in ``keys.refusals``, which only those keys decide)."""
    if isinstance(exc, AuthError):
        if keys is not None:
            keys.refusals.add(seen, exc)
    else:
        REFUSED.add(seen, exc)

class Tensors:
    """A strictly checked safetensors header over a reader; tensors are copied into caller
    memory (module docstring)."""

    def __init__(self, reader: RangeReader, key: str = "", keys: StoreKeys | None = None) -> None:
        """``keys``: the header's tag is checked over its raw bytes (and ``key``, the storage
        key) before they are parsed (``signed_header.py``); ``signed`` says whether it
        verified (False: an older or unsigned entry, which the metadata's checks decide).
        ``seen``: what a refusal of this header is remembered by (``remember``)."""
        self._reader = reader
        self.signed = False
        try:
            raw = headers.read_raw(reader)  # a storage failure raises as it is
            self.seen = headers.digest(raw, reader.size, key)
            REFUSED.check(self.seen)
            if keys is not None:
                keys.refusals.check(self.seen)
            try:
                header = self._parse_header(raw, key, keys)
                self._base = 8 + len(raw)
                self._read_specs(header, reader.size - self._base)
            except EntryError as exc:
                remember(self.seen, exc, keys)
                raise
        except BaseException:
            reader.close()
            raise

    def _parse_header(self, raw: bytes, key: str, keys: StoreKeys | None) -> dict:
        """The header in ``raw``, parsed once its tag (with ``keys``) verified."""
        tag = signed_header.locate(raw) if keys is not None else None
        if keys is not None and tag is not None:
            signed_header.check_tag(signed_header.check_sum(raw, tag), tag, key, keys)
            self.signed = True
        header = headers.loads(raw)
        if not isinstance(header, dict):
            raise EntryError("header is not a JSON object")
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(
                isinstance(v, str) for v in meta.values())):
            raise EntryError("header metadata is not a map of strings")
        self.metadata = meta
        return header

    def _read_specs(self, header: dict, data_len: int) -> None:
        """Every tensor's (dtype, shape, start, end), checked against the ``data_len`` bytes
        after the header."""
        try:
            self._specs = {name: _spec(name, spec, data_len) for name, spec in header.items()}
        except EntryError:
            raise
        except Exception as exc:  # noqa: BLE001 - untrusted values: anything else is a defect
            raise EntryError(f"malformed header entry: {type(exc).__name__}") from None
        end = max((end for _, _, _, end in self._specs.values()), default=0)
        if end != data_len:  # bytes no tensor holds: not what was written
            raise EntryError(f"{data_len - end} bytes past the last tensor")

    def names(self) -> list[str]:
        return list(self._specs)

    def spec(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) the header gives tensor ``name``."""
        dtype, shape, _, _ = self._specs[name]
        return dtype, shape

    @property
    def reader(self) -> RangeReader:
        """The reader under the header (what it can do: ``RangeReader``'s declared traits)."""
        return self._reader

    def span(self, name: str) -> tuple[int, int]:
        """Absolute [start, end) byte range of stored tensor ``name`` in the entry."""
        _, _, start, end = self._specs[name]
        return self._base + start, self._base + end

    def read_ahead(self, layers: list[list[str]]) -> None:
        """Tell the reader the byte spans of each layer's tensors (``layers[i]``: stored
        names), in the order they will be read."""
        self._reader.read_ahead([[self.span(n) for n in names] for names in layers])

    def read_many(self, items: list[tuple[str, torch.Tensor]]) -> None:
        """Read several tensors with one positioned scatter read per run of tensors that are
        adjacent in the file (all of an entry's tensors are: one system call per entry)."""
        placed = sorted(((*self._place(name, out), name) for name, out in items),
                        key=lambda p: (p[0], p[1]))
        run: list[tuple[int, int, memoryview, str]] = []
        for item in placed:
            if run and (item[0] != run[-1][1] or len(run) == IOV_MAX):
                self._read_run(run)
                run = []
            run.append(item)
        if run:
            self._read_run(run)

    def _read_run(self, run: list[tuple[int, int, memoryview, str]]) -> None:
        got = self._reader.read_into_many(self._base + run[0][0], [buf for _, _, buf, _ in run])
        if got != run[-1][1] - run[0][0]:
            short = next(name for start, end, _, name in run if run[0][0] + got < end)
            raise EntryError(f"truncated in {short}")

    def _place(self, name: str, out: torch.Tensor) -> tuple[int, int, memoryview]:
        """(start, end) of ``name`` in the data section and a byte view of ``out`` to read into."""
        dtype, shape, start, end = self._specs[name]
        if dtype != out.dtype or shape != tuple(out.shape):
            raise EntryError(f"{name} is {dtype} {shape}, expected {out.dtype} {tuple(out.shape)}")
        # writes land in ``out``
        return start, end, memoryview(out.view(torch.uint8).numpy().reshape(-1))

    def close(self) -> None:
        self._reader.close()


def _spec(name: str, spec: Any, data_len: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, start, end) of one header entry (parsed JSON: anything), every field
    checked against the data."""
    try:
        dtype = _ST_DTYPES[spec["dtype"]]
        shape = tuple(count(x) for x in spec["shape"])
        start, end = (count(x) for x in spec["data_offsets"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EntryError(f"malformed header entry {str(name)[:40]!r}: {exc!r}"[:300]) from None
    numel = math.prod(shape) if shape else 1
    if min(shape, default=0) < 0 or not 0 <= start <= end <= data_len:
        raise EntryError(f"header entry {name!r} points outside the data")
    if end - start != numel * dtype.itemsize:
        raise EntryError(f"header entry {name!r}: {end - start} bytes for shape {shape}")
    return dtype, shape, start, end


def count(x: Any) -> int:
    """A size, offset or token id from a header: a non-negative integer (not a bool, a float or
    a string), else ``ValueError``."""
    if type(x) is not int or not 0 <= x <= headers.MAX_INT:
        raise ValueError(f"{str(x)[:24]!r} is not a count")
    return x
