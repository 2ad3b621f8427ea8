"""Stored chunk KVs in and out: ``encode`` (and ``Entry``, encoded at most once for every byte
tier), ``decode`` and ``open_entry`` (an ``EntryReader``, store/entry_reader.py, over bytes, a
path, a file or a ``RangeReader``). The byte format, its versions and why it has that shape:
store/entry_format.py.

Entries are written by ``safetensors.torch.save`` and read by a small strict reader
(``tensors.py``: positioned reads into the caller's tensors, through a ``RangeReader``:
``readers.py``); any safetensors tool reads them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import safetensors.torch
import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store import signed_header
from blendrag.store.auth import StoreKeys
from blendrag.store.config import KV_FORMATS
from blendrag.store.entry_format import (
    CONTEXT_SHIFT,
    FORMAT_NAME,
    FORMAT_VERSION,
    PROFILE,
    SIGNED_VERSION,
    STORED,
    digest,
    dtype_name,
    meta_digest,
    sha_digest,
)
from blendrag.store.entry_reader import EntryReader
from blendrag.store.readers import BufferReader, FileReader, RangeReader
from blendrag.store.tensors import Tensors

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
    dtype = dtype_name(kv.keys.dtype)
    stored = dtype if kv_format == "model" else kv_format
    keys = kv.keys.detach().to("cpu").contiguous()
    values = kv.values.detach().to("cpu").contiguous()
    tensors: dict[str, torch.Tensor] = {}
    for i in range(kv.num_layers):
        tensors.update(_encode_layer(i, keys[i], values[i], stored))
    for name, prior in ((PROFILE, kv.profile), (CONTEXT_SHIFT, kv.context_shift)):
        if prior is not None:
            tensors[name] = prior.detach().to("cpu", torch.float32).contiguous()
    digest_of = sha_digest if signer is not None else digest
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
        "checksums": json.dumps({name: digest_of(t) for name, t in tensors.items()}),
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
        return {f"k.{i}": k.to(STORED[stored]).contiguous(),
                f"v.{i}": v.to(STORED[stored]).contiguous()}
    # K per channel (outlier channels keep their range), V per token, symmetric to +-127
    k32, v32 = k.float(), v.float()
    ks = (k32.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)  # [H, 1, D]
    vs = (v32.abs().amax(dim=2, keepdim=True) / 127).clamp_min(1e-12)  # [H, T, 1]
    return {f"k.{i}": (k32 / ks).round().clamp(-127, 127).to(torch.int8).contiguous(),
            f"v.{i}": (v32 / vs).round().clamp(-127, 127).to(torch.int8).contiguous(),
            f"ks.{i}": ks.contiguous(), f"vs.{i}": vs.contiguous()}


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
