"""The request's KV: one static buffer per request (gpt-fast style), rotated keys.

Rows come from two places: cached chunk KVs, rotated to their positions in this request,
and tokens the request computes, which overwrite their rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.model.rope import RopeTable


@dataclass
class CachedSegment:
    """A cached KV placed at ``start`` in the request."""

    start: int
    kv: ChunkKV

    @property
    def end(self) -> int:
        return self.start + self.kv.num_tokens


class FusedKV:
    """k, v: [layers, kv_heads, capacity, head_dim]; rows [0, length) are valid after prefill."""

    def __init__(self, layers: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.empty(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def load(self, layer: int, segments: list[CachedSegment], rope: RopeTable) -> None:
        """Write the cached rows of ``layer``, keys rotated at their positions in this request."""
        for seg in segments:
            rows = slice(seg.start, seg.end)
            k = seg.kv.keys[layer].to(self.k.device, self.k.dtype, non_blocking=True)  # [Hkv, T, D]
            self.k[layer, :, rows] = rope.rotate(k, rows)
            self.v[layer, :, rows] = seg.kv.values[layer].to(self.v.device, self.v.dtype,
                                                             non_blocking=True)

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """pos: [A] positions; k, v: [Hkv, A, D] (k rotated)."""
        self.k[layer].index_copy_(1, pos, k)
        self.v[layer].index_copy_(1, pos, v)

    def rows(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of ``layer`` for positions [0, n): [Hkv, n, D] each (views)."""
        return self.k[layer, :, :n], self.v[layer, :, :n]
