"""Byte format of one stored chunk KV: a safetensors file, one tensor per layer and kind; its
names, versions and digests. Written by ``encode`` (store/codec.py), read by ``EntryReader``
(store/entry_reader.py).

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
"""

from __future__ import annotations

import hashlib
import json

import torch
import xxhash

from blendrag.store import signed_header
from blendrag.store.auth import SHA256

FORMAT_NAME = "blendrag-chunk-kv"
FORMAT_VERSION = 4  # 4: "stored" (3: "profile", "context_tag"; 2: "sensitivity", "context")
# 6: a version-4 entry signed over its raw header ("header_tag", SHA-256 tensor digests);
# 5: signed over its parsed metadata ("auth"), read but no longer written
SIGNED_VERSION = 6
READ_VERSIONS = ("2", "3", "4", "5", "6")
SIGNED_VERSIONS = ("5", "6")
# What a signature replaces in the metadata checksum (the tag is computed after it).
UNCHECKSUMMED = ("meta_checksum", "auth", signed_header.FIELD)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
STORED = {**DTYPES, "int8": torch.int8}
PROFILE = "profile"
# What version 2 called the profile tensor and the context tag field.
V2_NAMES = {"sensitivity": PROFILE}
V2_CONTEXT = "context"
CONTEXT_SHIFT = "context_shift"
# The most values one token has in one layer's keys (heads x head size): 1,024 in a 7B model.
MAX_ROW_VALUES = 1 << 20


def dtype_name(dtype: torch.dtype) -> str:
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(f"chunk KV dtype {dtype} is not storable; use one of {sorted(DTYPES)}")


def digest(t: torch.Tensor) -> str:
    return xxhash.xxh3_128_hexdigest(t.contiguous().view(torch.uint8).numpy())


def sha_digest(t: torch.Tensor) -> str:
    return SHA256 + hashlib.sha256(t.contiguous().view(torch.uint8).numpy()).hexdigest()


def meta_digest(meta: dict[str, str]) -> str:
    """The ``meta_checksum`` of the metadata fields ``meta`` (xxh3-128 over them as sorted JSON):
    what a tool that rewrites an entry's metadata sets."""
    return xxhash.xxh3_128_hexdigest(json.dumps(meta, sort_keys=True,
                                                separators=(",", ":")).encode())
