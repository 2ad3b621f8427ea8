"""A stored entry opened for reading (``EntryReader``): its header parsed and checked once
(damage before forgery), then any layer read and verified on its own; the format is
store/entry_format.py's."""

from __future__ import annotations

from typing import Any

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import header as headers
from blendrag.store.auth import SHA256, StoreKeys, authenticate
from blendrag.store.entry_format import (
    CONTEXT_SHIFT,
    DTYPES,
    FORMAT_NAME,
    MAX_ROW_VALUES,
    PROFILE,
    READ_VERSIONS,
    SIGNED_VERSIONS,
    STORED,
    UNCHECKSUMMED,
    V2_CONTEXT,
    V2_NAMES,
    digest,
    meta_digest,
    sha_digest,
)
from blendrag.store.errors import AuthError, EntryError, NewerFormatError
from blendrag.store.tensors import Tensors, count, remember


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
            # isdecimal: "²" is a digit to isdigit, and int() refuses it
            kind = (NewerFormatError if version.isdecimal() and int(version) > newest
                    else EntryError)
            raise kind(f"format version {version!r}, this build reads "
                       f"{', '.join(READ_VERSIONS)}")
        body = {k: v for k, v in meta.items() if k not in UNCHECKSUMMED}
        if meta.get("meta_checksum") != meta_digest(body):
            raise EntryError("metadata checksum mismatch")
        try:
            self._parse_fields(meta)
        except EntryError:
            raise
        except Exception as exc:  # noqa: BLE001 - untrusted values: anything else is a defect
            raise EntryError(f"malformed metadata: {type(exc).__name__}") from None
        if self._keys is not None:
            try:
                self._authenticate(meta, self._keys)
            except AuthError:
                raise
            except Exception as exc:  # noqa: BLE001 - untrusted values: not authenticated
                raise AuthError(f"unverifiable signature: {type(exc).__name__}") from None
        if meta["key"] != key:  # signed: copied from another name, so not this one's
            error = AuthError if self._keys is not None else EntryError
            raise error(f"entry was written for key …{str(meta['key'])[-16:]}, not …{key[-16:]}")

    def _authenticate(self, meta: dict, keys: StoreKeys) -> None:
        """``AuthError`` unless the entry is signed as this store requires: its raw header's tag
        verified (``Tensors.signed``), or a version-5 tag over its metadata; every tensor
        digest the tag covers a SHA-256 one."""
        version = meta["version"]
        if version not in SIGNED_VERSIONS:
            raise AuthError("unsigned entry: this store requires entries signed with its keys")
        if version == "6" and not self._tensors.signed:
            raise AuthError("a version-6 entry without its header tag")
        if version == "5":
            authenticate(meta, keys)
        if not all(d.startswith(SHA256) for d in self._checksums.values()):
            raise AuthError("signed entry whose tensor digests are not SHA-256")

    def _parse_fields(self, meta: dict) -> None:
        try:
            self.dtype = DTYPES[meta["dtype"]]
            # before version 4, K and V were stored in the dtype a read returns
            stored = meta["stored"] if meta["version"] not in ("2", "3") else meta["dtype"]
            self.stored = STORED[stored]
            self.shape = tuple(count(x) for x in headers.loads(meta["shape"]))
            self.token_ids = tuple(count(t) for t in headers.loads(meta["token_ids"]))
            self._checksums = {str(n): _text(d)
                               for n, d in dict(headers.loads(meta["checksums"])).items()}
            self.prefix_hash = str(meta["prefix_hash"])
            v2 = meta["version"] == "2"
            self.context_tag = str(meta[V2_CONTEXT if v2 else "context_tag"])
            self._names = dict(V2_NAMES) if v2 else {}  # stored name -> our name
        except (KeyError, ValueError, TypeError) as exc:
            raise EntryError(f"malformed metadata: {exc!r}") from None
        if (len(self.shape) != 4 or min(self.shape) < 0 or 0 in self.shape[:2] + self.shape[3:]
                or self.shape[2] != len(self.token_ids)):
            raise EntryError(f"shape {self.shape} is not [L, H, T, D] (T >= 0, others > 0) for "
                             f"{len(self.token_ids)} token ids")
        # With T = 0 the tensors hold no bytes, so the byte ranges bound nothing: H x D is
        # bounded here, or a [L, H, 0, D] buffer's strides overflow when it is allocated.
        if self.shape[1] * self.shape[3] > MAX_ROW_VALUES:
            raise EntryError(f"{self.shape[1]} x {self.shape[3]} values a row, more than any "
                             f"model's ({MAX_ROW_VALUES})")
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
                       self.context_tag, priors.get(CONTEXT_SHIFT),
                       rounded=self.stored != self.dtype)

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
            if sha_digest(out) != want:
                raise EntryError(f"SHA-256 digest mismatch in {name}")
        elif digest(out) != want:
            raise EntryError(f"checksum mismatch in {name}")

    def close(self) -> None:
        self._tensors.close()

    def __enter__(self) -> EntryReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode_into(out: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor | None) -> None:
    """A stored K or V [H, T, D] back into ``out`` (the model's dtype): a cast, or for int8
    the product with its scales, written straight into ``out`` (no float32 temporary)."""
    if scale is None:
        out.copy_(stored)
    else:
        torch.mul(stored, scale, out=out)


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise ValueError("a tensor digest is not a string")
    return x
