"""The unit of reuse: one chunk's KV rows, computed after a shared prefix.

Keys are stored *before* RoPE so that they can be rotated exactly to whatever positions the
chunk occupies in a later request, for every RoPE variant (docs/architecture.md,
"Exactness rules").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChunkKV:
    """KV cache rows of one chunk (or of a prefix).

    keys:   [layers, kv_heads, T, head_dim]  pre-RoPE (after q/k norm where the model has one)
    values: [layers, kv_heads, T, head_dim]
    token_ids: the T token ids these rows belong to (collision guard on a cache hit)
    prefix_hash: hex digest of the prefix ids the chunk was computed after ("" for a prefix)
    sensitivity: [T] float32 or None: how far each token's keys move when the chunk follows
      another chunk instead of the prefix alone (the ``profile`` selector's prior, see
      ``engine/profile.py``); None when the chunk was stored without a profile
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: tuple[int, ...]
    prefix_hash: str = ""
    sensitivity: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.keys.shape != self.values.shape:
            raise ValueError(
                f"ChunkKV keys {tuple(self.keys.shape)} and values {tuple(self.values.shape)} "
                "differ"
            )
        if self.keys.dim() != 4:
            raise ValueError(
                "ChunkKV tensors must be [layers, kv_heads, T, head_dim], got "
                f"{tuple(self.keys.shape)}"
            )
        if self.keys.shape[2] != len(self.token_ids):
            raise ValueError(
                f"ChunkKV has {self.keys.shape[2]} rows but {len(self.token_ids)} token ids"
            )
        self.token_ids = tuple(int(t) for t in self.token_ids)
        if self.sensitivity is not None and tuple(self.sensitivity.shape) != (len(self.token_ids),):
            raise ValueError(
                f"ChunkKV sensitivity must be [T] = [{len(self.token_ids)}], got "
                f"{tuple(self.sensitivity.shape)}"
            )

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    def to(self, device: torch.device | str) -> ChunkKV:
        if self.keys.device == torch.device(device):
            return self
        return ChunkKV(
            self.keys.to(device, non_blocking=True),
            self.values.to(device, non_blocking=True),
            self.token_ids,
            self.prefix_hash,
            self.sensitivity,
        )

    def with_sensitivity(self, sensitivity: torch.Tensor) -> ChunkKV:
        """The same rows with a profile attached (float32 on the CPU: it is read on the host)."""
        return ChunkKV(self.keys, self.values, self.token_ids, self.prefix_hash,
                       sensitivity.detach().to("cpu", torch.float32).contiguous())
