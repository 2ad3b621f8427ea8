"""Byte format of one stored chunk KV: a safetensors file, one tensor per layer and kind.

Layout::

    k.{i}, v.{i}    [kv_heads, T, head_dim] of layer i (keys pre-RoPE), in the stored format
    ks.{i}, vs.{i}  int8 only: float32 scales, K per channel [kv_heads, 1, head_dim], V per
                    token [kv_heads, T, 1]
    profile         [T] float32, optional: the chunk's context-sensitivity profile
    context_shift   [L, T] float32, optional: per layer, how far context moves each value
    __metadata__    format, version, key, prefix_hash, context_tag, dtype (what a read returns),
                    stored (the format of k/v: a float dtype or int8), shape [L, H, T, D],
                    token_ids (JSON list), checksums (JSON {tensor name: xxh3-128 hex, or
                    "sha256:" hex in a signed entry}), meta_checksum (xxh3-128 over all the
                    other metadata fields); a signed entry (version 6): header_tag, a checksum
                    and the store key's HMAC-SHA256 over the raw header bytes and the storage
                    key (``signed_header.py``; version 5: auth, an HMAC over the parsed
                    metadata, ``auth.py``, still read)

Why this shape: safetensors holds plain tensors and never runs code on load (a cache
directory is an attack surface, ``torch.load``/pickle would execute whatever it is given); one
tensor per layer lets a reader pull layer i without touching the others (layer-wise loading,
docs/architecture.md, "Stored entries and layer-wise loading"); a checksum per tensor verifies
each layer on its own. Anything that fails a check raises ``EntryError``, which the tiers turn
into a logged miss. Every header value is untrusted until checked: the header is parsed by a
strict, depth-checked parser (``header.py``), and with store keys only after its tag verified.

Entries are written by ``safetensors.torch.save`` and read by a small strict reader
(``tensors.py``: positioned reads into the caller's tensors, through a ``RangeReader``:
``readers.py``); any safetensors tool reads them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, BinaryIO

import safetensors.torch
import torch
import xxhash

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import header as headers
from blendrag.store import signed_header
from blendrag.store.auth import SHA256, StoreKeys, authenticate
from blendrag.store.config import KV_FORMATS
from blendrag.store.errors import AuthError, EntryError, NewerFormatError
from blendrag.store.readers import BufferReader, FileReader, RangeReader
from blendrag.store.tensors import Tensors, count, remember

FORMAT_NAME = "blendrag-chunk-kv"
FORMAT_VERSION = 4  # 4: "stored" (3: "profile", "context_tag"; 2: "sensitivity", "context")
# 6: a version-4 entry signed over its raw header ("header_tag", SHA-256 tensor digests);
# 5: signed over its parsed metadata ("auth"), read but no longer written
SIGNED_VERSION = 6
READ_VERSIONS = ("2", "3", "4", "5", "6")
_SIGNED = ("5", "6")
# What a signature replaces in the metadata checksum (the tag is computed after it).
_UNCHECKSUMMED = ("meta_checksum", "auth", signed_header.FIELD)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_STORED = {**_DTYPES, "int8": torch.int8}
PROFILE = "profile"
# What version 2 called the profile tensor and the context tag field.
_V2_NAMES = {"sensitivity": PROFILE}
_V2_CONTEXT = "context"
CONTEXT_SHIFT = "context_shift"

Source = bytes | bytearray | memoryview | str | Path | BinaryIO


class Entry:
    """A chunk KV on its way into a store's tiers, encoded at most once: a tier that stores bytes
    takes ``encoded(...)`` (the bytes it was read from, or encoded on first use); RAM keeps
    ``kv``."""

    def __init__(self, key: str, kv: ChunkKV, data: bytes | None = None,
                 exact: bool = False) -> None:
        """``data``: the bytes ``kv`` was read from (any format: a faster tier takes them as
        they are stored). ``exact``: stored in the model's dtype whatever the tier's format."""
        self.key = key
        self.kv = kv
        self._data = data
        self.exact = exact

    def encoded(self, kv_format: str, keys: StoreKeys | None = None) -> bytes:
        """The bytes read, else the entry encoded with K and V in ``kv_format`` (the model's
        dtype when the entry is ``exact``) and signed with ``keys``; once: every byte tier of
        a store shares its format and keys."""
        if self._data is None:
            self._data = encode(self.key, self.kv, "model" if self.exact else kv_format, keys)
        return self._data


def encode(key: str, kv: ChunkKV, kv_format: str = "model",
           signer: StoreKeys | None = None) -> bytes:
    """Serialize ``kv`` stored under ``key`` (tensors are copied to CPU if needed), K and V in
    ``kv_format`` (``KV_FORMATS``; "model": the KV's own dtype, exact); signed with ``signer``'s
    active key when given (each tensor then digested with SHA-256, which the tag covers)."""
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format must be one of {', '.join(KV_FORMATS)}, got {kv_format!r}")
    dtype = _dtype_name(kv.keys.dtype)
    stored = dtype if kv_format == "model" else kv_format
    keys = kv.keys.detach().to("cpu").contiguous()
    values = kv.values.detach().to("cpu").contiguous()
    tensors: dict[str, torch.Tensor] = {}
    for i in range(kv.num_layers):
        tensors.update(_encode_layer(i, keys[i], values[i], stored))
    for name, prior in ((PROFILE, kv.profile), (CONTEXT_SHIFT, kv.context_shift)):
        if prior is not None:
            tensors[name] = prior.detach().to("cpu", torch.float32).contiguous()
    digest = _sha_digest if signer is not None else _digest
    meta = {
        "format": FORMAT_NAME,
        "version": str(FORMAT_VERSION if signer is None else SIGNED_VERSION),
        "key": key,
        "prefix_hash": kv.prefix_hash,
        "context_tag": kv.context_tag,
        "dtype": dtype,
        "stored": stored,
        "shape": json.dumps(list(keys.shape)),
        "token_ids": json.dumps(list(kv.token_ids)),
        "checksums": json.dumps({name: digest(t) for name, t in tensors.items()}),
    }
    meta["meta_checksum"] = meta_digest(meta)
    if signer is None:
        return safetensors.torch.save(tensors, metadata=meta)
    meta[signed_header.FIELD] = signed_header.placeholder(signer.active)
    return signed_header.seal_header(safetensors.torch.save(tensors, metadata=meta), key, signer)


def _encode_layer(i: int, k: torch.Tensor, v: torch.Tensor,
                  stored: str) -> dict[str, torch.Tensor]:
    """Layer ``i``'s tensors in the ``stored`` format; k, v: [kv_heads, T, head_dim]."""
    if stored != "int8":
        return {f"k.{i}": k.to(_STORED[stored]).contiguous(),
                f"v.{i}": v.to(_STORED[stored]).contiguous()}
    # K per channel (outlier channels keep their range), V per token, symmetric to +-127
    k32, v32 = k.float(), v.float()
    ks = (k32.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)  # [H, 1, D]
    vs = (v32.abs().amax(dim=2, keepdim=True) / 127).clamp_min(1e-12)  # [H, T, 1]
    return {f"k.{i}": (k32 / ks).round().clamp(-127, 127).to(torch.int8).contiguous(),
            f"v.{i}": (v32 / vs).round().clamp(-127, 127).to(torch.int8).contiguous(),
            f"ks.{i}": ks.contiguous(), f"vs.{i}": vs.contiguous()}


def _decode_into(out: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor | None) -> None:
    """A stored K or V [H, T, D] back into ``out`` (the model's dtype): a cast, or for int8
    the product with its scales, written straight into ``out`` (no float32 temporary)."""
    if scale is None:
        out.copy_(stored)
    else:
        torch.mul(stored, scale, out=out)


def decode(source: Source, key: str, keys: StoreKeys | None = None) -> ChunkKV:
    """Read and verify a whole entry (authenticated with ``keys`` when given); raises
    ``EntryError`` on any defect, ``AuthError`` when ``keys`` do not authenticate it."""
    with open_entry(source, key, keys) as entry:
        return entry.read_all()


def open_entry(source: Source | RangeReader, key: str,
               keys: StoreKeys | None = None) -> EntryReader:
    """Open an entry for layer-by-layer reading (bytes, a path, an open binary file, or a
    ``RangeReader`` such as the Redis tier's GETRANGE reader); with ``keys``, its tag is
    checked before anything else of it is trusted, and every tensor against its signed
    SHA-256 digest as it is read."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        reader: RangeReader = BufferReader(source)
    elif isinstance(source, RangeReader):
        reader = source
    else:
        reader = FileReader(source)
    return EntryReader(Tensors(reader, key, keys), key, keys)


class EntryReader:
    """A verified entry header; ``layer(i)`` reads and checks one layer's K and V."""

    def __init__(self, tensors: Tensors, key: str, keys: StoreKeys | None = None) -> None:
        self._tensors = tensors
        self._keys = keys
        try:
            self._parse(tensors.metadata, key)
        except EntryError as exc:
            remember(tensors.seen, exc, keys)
            tensors.close()
            raise
        except BaseException:
            tensors.close()
            raise
        if tensors.reader.fetches_ahead:  # a per-read latency (S3): every layer, in parallel
            tensors.read_ahead([[self._stored[n] for n in self._layer_names(i)]
                                for i in range(self.num_layers)])

    def _parse(self, meta: dict | None, key: str) -> None:
        """Check the metadata: what damage breaks (``EntryError``) before what only a forgery
        can fail (``AuthError``: a tag this store's keys do not accept over intact metadata)."""
        if not meta or meta.get("format") != FORMAT_NAME:
            raise EntryError("foreign file: no blendrag chunk-KV metadata")
        version = meta.get("version")
        if version not in READ_VERSIONS:
            version = str(version)[:8]
            newest = max(int(v) for v in READ_VERSIONS)
            kind = (NewerFormatError if version.isdigit() and int(version) > newest
                    else EntryError)
            raise kind(f"format version {version!r}, this build reads "
                       f"{', '.join(READ_VERSIONS)}")
        body = {k: v for k, v in meta.items() if k not in _UNCHECKSUMMED}
        if meta.get("meta_checksum") != meta_digest(body):
            raise EntryError("metadata checksum mismatch")
        try:
            self._parse_fields(meta)
        except EntryError:
            raise
        except Exception as exc:  # noqa: BLE001 - untrusted values: anything else is a defect
            raise EntryError(f"malformed metadata: {type(exc).__name__}") from None
        if self._keys is not None:
            self._authenticate(meta, self._keys)
        if meta["key"] != key:  # signed: copied from another name, so not this one's
            error = AuthError if self._keys is not None else EntryError
            raise error(f"entry was written for key …{str(meta['key'])[-16:]}, not …{key[-16:]}")

    def _authenticate(self, meta: dict, keys: StoreKeys) -> None:
        """``AuthError`` unless the entry is signed as this store requires: its raw header's tag
        verified (``Tensors.signed``), or a version-5 tag over its metadata; every tensor
        digest the tag covers a SHA-256 one."""
        version = meta["version"]
        if version not in _SIGNED:
            raise AuthError("unsigned entry: this store requires entries signed with its keys")
        if version == "6" and not self._tensors.signed:
            raise AuthError("a version-6 entry without its header tag")
        if version == "5":
            authenticate(meta, keys)
        if not all(d.startswith(SHA256) for d in self._checksums.values()):
            raise AuthError("signed entry whose tensor digests are not SHA-256")

    def _parse_fields(self, meta: dict) -> None:
        try:
            self.dtype = _DTYPES[meta["dtype"]]
            # before version 4, K and V were stored in the dtype a read returns
            stored = meta["stored"] if meta["version"] not in ("2", "3") else meta["dtype"]
            self.stored = _STORED[stored]
            self.shape = tuple(count(x) for x in headers.loads(meta["shape"]))
            self.token_ids = tuple(count(t) for t in headers.loads(meta["token_ids"]))
            self._checksums = {str(n): _text(d)
                               for n, d in dict(headers.loads(meta["checksums"])).items()}
            self.prefix_hash = str(meta["prefix_hash"])
            v2 = meta["version"] == "2"
            self.context_tag = str(meta[_V2_CONTEXT if v2 else "context_tag"])
            self._names = dict(_V2_NAMES) if v2 else {}  # stored name -> our name
        except (KeyError, ValueError, TypeError) as exc:
            raise EntryError(f"malformed metadata: {exc!r}") from None
        if (len(self.shape) != 4 or min(self.shape) < 0 or 0 in self.shape[:2] + self.shape[3:]
                or self.shape[2] != len(self.token_ids)):
            raise EntryError(f"shape {self.shape} is not [L, H, T, D] (T >= 0, others > 0) for "
                             f"{len(self.token_ids)} token ids")
        if 2 * self.shape[0] > len(self._tensors.names()):  # before a set of 2L+ names is built
            raise EntryError(f"{len(self._tensors.names())} tensors for {self.shape[0]} layers")
        names = {name for i in range(self.shape[0]) for name in self._layer_names(i)}
        stored = {self._names.get(n, n): n for n in self._checksums}  # our name -> stored name
        self._checksums = {ours: self._checksums[theirs] for ours, theirs in stored.items()}
        self._stored = stored
        self.priors = {PROFILE: (self.shape[2],), CONTEXT_SHIFT: (self.shape[0], self.shape[2])}
        self.priors = {k: v for k, v in self.priors.items() if k in self._checksums}
        names.update(self.priors)
        if set(self._checksums) != names or set(self._tensors.names()) != set(stored.values()):
            raise EntryError("tensor names do not match the declared layer count")
        # Every tensor the header lists must have the declared dtype and shape before anything
        # is allocated: the shape is then bounded by bytes the entry really holds.
        for name in names:
            want = self._spec_of(name)
            if self._tensors.spec(stored[name]) != want:
                dtype, shape = self._tensors.spec(stored[name])
                raise EntryError(f"{name} is {dtype} {shape}, the metadata declares "
                                 f"{want[0]} {want[1]}")

    def _spec_of(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) the header's fields allow tensor ``name``."""
        h, t, d = self.shape[1:]
        if name in self.priors:
            return torch.float32, self.priors[name]
        kind = name.split(".")[0]
        return {"ks": (torch.float32, (h, 1, d)), "vs": (torch.float32, (h, t, 1))}.get(
            kind, (self.stored, (h, t, d)))

    @property
    def num_layers(self) -> int:
        return self.shape[0]

    @property
    def concurrent_reads(self) -> bool:
        """Whether layers may be read from several threads at once (positioned reads on an
        entry file: ``layered.py`` reads them ahead)."""
        return self._tensors.reader.concurrent_reads

    def span(self, name: str) -> tuple[int, int]:
        """Absolute [start, end) byte range of tensor ``name`` (e.g. "v.1") in the stored entry:
        where a tool finds one layer's bytes."""
        return self._tensors.span(self._stored[name])

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``i``, each [kv_heads, T, head_dim], verified; only that
        layer's bytes are read."""
        k = torch.empty(self.shape[1:], dtype=self.dtype)
        v = torch.empty(self.shape[1:], dtype=self.dtype)
        self.layer_into(i, k, v)
        return k, v

    def layer_into(self, i: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Read layer ``i`` into ``k`` and ``v`` (contiguous [kv_heads, T, head_dim] of the
        entry's dtype) and verify both against their checksums; one scatter read when the two
        tensors are adjacent in the entry."""
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {i} out of range for {self.num_layers} layers")
        if self.stored == self.dtype:
            self._read_verified([(f"k.{i}", k), (f"v.{i}", v)])
            return
        # a compressed layer: read as stored, verified, then decoded into the caller's tensors
        parts = {name: torch.empty(shape, dtype=dtype) for name, (dtype, shape) in (
            (n, self._spec_of(n)) for n in self._layer_names(i))}
        self._read_verified(list(parts.items()))
        _decode_into(k, parts[f"k.{i}"], parts.get(f"ks.{i}"))
        _decode_into(v, parts[f"v.{i}"], parts.get(f"vs.{i}"))

    def _layer_names(self, i: int) -> list[str]:
        kinds = ("k", "v", "ks", "vs") if self.stored == torch.int8 else ("k", "v")
        return [f"{kind}.{i}" for kind in kinds]

    def read_priors(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The profile [T] and context shift [L, T] (float32, verified), None where the
        entry has none: what a reader needs before the first layer."""
        priors = {name: torch.empty(shape, dtype=torch.float32)
                  for name, shape in self.priors.items()}
        if priors:
            self._read_verified(list(priors.items()))
        return priors.get(PROFILE), priors.get(CONTEXT_SHIFT)

    def read_all(self) -> ChunkKV:
        """Every layer, read straight into one stacked ``ChunkKV`` (one copy from the source, in
        one scatter read: as fast as a plain read of the file), then verified."""
        keys = torch.empty(self.shape, dtype=self.dtype)
        values = torch.empty(self.shape, dtype=self.dtype)
        priors = {name: torch.empty(shape, dtype=torch.float32)
                  for name, shape in self.priors.items()}
        if self.stored == self.dtype:
            parts = [
                (f"{kind}.{i}", t[i])
                for i in range(self.num_layers)
                for kind, t in (("k", keys), ("v", values))
            ]
            self._read_verified(parts + list(priors.items()))
        else:  # compressed: decoded layer by layer
            for i in range(self.num_layers):
                self.layer_into(i, keys[i], values[i])
            if priors:
                self._read_verified(list(priors.items()))
        return ChunkKV(keys, values, self.token_ids, self.prefix_hash, priors.get(PROFILE),
                       self.context_tag, priors.get(CONTEXT_SHIFT))

    def _read_verified(self, parts: list[tuple[str, torch.Tensor]]) -> None:
        """Read each (name, out) of ``parts`` (our names; an older version's stored names are
        read) and verify it."""
        self._tensors.read_many([(self._stored[name], out) for name, out in parts])
        for name, out in parts:
            self._verify(name, out)

    def _verify(self, name: str, out: torch.Tensor) -> None:
        # with keys, the header is authentic by now: a payload that is not what its digest
        # says is damage (the entry may be rewritten), whoever damaged it
        want = self._checksums[name]
        if want.startswith(SHA256):
            if _sha_digest(out) != want:
                raise EntryError(f"SHA-256 digest mismatch in {name}")
        elif _digest(out) != want:
            raise EntryError(f"checksum mismatch in {name}")

    def close(self) -> None:
        self._tensors.close()

    def __enter__(self) -> EntryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise ValueError("a tensor digest is not a string")
    return x


def _dtype_name(dtype: torch.dtype) -> str:
    for name, d in _DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"chunk KV dtype {dtype} is not storable; use one of {sorted(_DTYPES)}")


def _digest(t: torch.Tensor) -> str:
    return xxhash.xxh3_128_hexdigest(t.contiguous().view(torch.uint8).numpy())


def _sha_digest(t: torch.Tensor) -> str:
    return SHA256 + hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()


def meta_digest(meta: dict[str, str]) -> str:
    """The ``meta_checksum`` of the metadata fields ``meta`` (xxh3-128 over them as sorted JSON):
    what a tool that rewrites an entry's metadata sets."""
    return xxhash.xxh3_128_hexdigest(json.dumps(meta, sort_keys=True,
                                                separators=(",", ":")).encode())
