"""Deterministic chunk KVs for store tests (identical in every process for the same seed)."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.config import StoreConfig


def make_kv(seed: int, *, layers: int = 3, heads: int = 2, tokens: int = 8, dim: int = 16,
            dtype: torch.dtype = torch.float32, profile: bool = False) -> ChunkKV:
    """Random KV whose bytes depend only on the arguments; ``profile``: with a random
    context-sensitivity profile ([T] float32) too."""
    g = torch.Generator().manual_seed(seed)
    shape = (layers, heads, tokens, dim)
    keys = torch.randn(shape, generator=g).to(dtype)
    values = torch.randn(shape, generator=g).to(dtype)
    ids = tuple(int(x) for x in torch.randint(0, 50_000, (tokens,), generator=g))
    prior = torch.rand(tokens, generator=g) * 100 if profile else None
    return ChunkKV(keys, values, ids, prefix_hash=f"prefix-{seed}", profile=prior)


def same_bits(a: ChunkKV, b: ChunkKV) -> bool:
    """Bitwise equality of two entries (NaN payloads and -0.0 included), profiles included."""
    return (
        a.keys.dtype == b.keys.dtype
        and a.keys.shape == b.keys.shape
        and torch.equal(a.keys.view(torch.uint8), b.keys.view(torch.uint8))
        and torch.equal(a.values.view(torch.uint8), b.values.view(torch.uint8))
        and a.token_ids == b.token_ids
        and a.prefix_hash == b.prefix_hash
        and same_profile(a, b)
    )


def same_profile(a: ChunkKV, b: ChunkKV) -> bool:
    """Both without a context-sensitivity profile, or both with bitwise equal float32 ones."""
    if a.profile is None or b.profile is None:
        return a.profile is None and b.profile is None
    return (a.profile.dtype == b.profile.dtype == torch.float32
            and torch.equal(a.profile.view(torch.uint8), b.profile.view(torch.uint8)))


def entry_bytes(**kw) -> int:
    """Encoded size of an entry made with these make_kv arguments."""
    from blendrag.store.codec import encode

    return len(encode("k" * 64, make_kv(0, **kw)))


def rewrite_header(data: bytes, edit: Callable[[dict], None]) -> bytes:
    """An encoded entry with its safetensors header JSON changed by ``edit`` (tamper tests)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    edit(header)
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data[8 + n :]


def exact_config(**kw) -> StoreConfig:
    """A ``StoreConfig`` whose persistent tiers keep K and V in the model's dtype: the storage
    tests compare what is read with what was written bit for bit (the compressed formats are
    tested in tests/blendrag/store/test_kv_formats.py)."""
    return StoreConfig(kv_format="model", **kw)
