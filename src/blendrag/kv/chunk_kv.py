"""The unit of reuse: one chunk's KV rows, computed after a shared prefix.

Keys are stored *before* RoPE so that they can be rotated exactly to whatever positions the
chunk occupies in a later request, for every RoPE variant (docs/architecture.md,
"Exactness rules").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from blendrag.kv.locked import note_copies


@dataclass
class ChunkKV:
    """KV cache rows of one chunk (or of a prefix).

    keys:   [layers, kv_heads, T, head_dim]  pre-RoPE (after q/k norm where the model has one)
    values: [layers, kv_heads, T, head_dim]
    token_ids: the T token ids these rows belong to (collision guard on a cache hit)
    prefix_hash: hex digest of the prefix ids the chunk was computed after ("" for a prefix)
    profile: [T] float32 or None: the context-sensitivity profile, how far each token's keys
      move when the chunk follows another chunk instead of the prefix alone (the ``profile``
      selector's prior, see ``engine/caches/profile.py``); None when the chunk was stored without
      one
    context_tag: tag of the ingestion context the rows were computed in ("" = after the prefix
      alone; see ``engine/caches/context.py``): part of the store key
    context_shift: [layers, T] float32 or None: per layer, the squared L2 distance (summed over
      heads) between each token's values computed in that context and after the prefix alone;
      how far context moves the token (the ``preview`` selector's prior)
    rounded: the rows were read back from a smaller format than the model's (a store's
      ``kv_format``: bfloat16, int8), so they are within its rounding of the computed ones, not
      equal: rows a request counts as exact (a prefix, prefix mode's chunk) are computed again
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: tuple[int, ...]
    prefix_hash: str = ""
    profile: torch.Tensor | None = None
    context_tag: str = ""
    context_shift: torch.Tensor | None = None
    rounded: bool = False

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
        if self.profile is not None and tuple(self.profile.shape) != (len(self.token_ids),):
            raise ValueError(
                f"ChunkKV profile must be [T] = [{len(self.token_ids)}], got "
                f"{tuple(self.profile.shape)}"
            )
        # the priors are read on the host (selectors rank tokens there): kept on the CPU
        if self.profile is not None and self.profile.device.type != "cpu":
            self.profile = self.profile.cpu()
        if self.context_shift is not None and self.context_shift.device.type != "cpu":
            self.context_shift = self.context_shift.cpu()
        expected = (self.num_layers, len(self.token_ids))
        if self.context_shift is not None and tuple(self.context_shift.shape) != expected:
            raise ValueError(f"ChunkKV context_shift must be [layers, T] = {list(expected)}, got "
                             f"{tuple(self.context_shift.shape)}")

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[2]

    @property
    def num_layers(self) -> int:
        return self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    @property
    def extra_nbytes(self) -> int:
        """Bytes of the optional per-token priors (profile, context shift)."""
        return sum(t.numel() * t.element_size()
                   for t in (self.profile, self.context_shift) if t is not None)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``i``: [kv_heads, T, head_dim] views (the layer-wise read of
        an entry held in memory, ``blendrag.store.layered``)."""
        return self.keys[i], self.values[i]

    def to(self, device: torch.device | str) -> ChunkKV:
        """K and V on ``device`` (the priors stay on the host, where selectors read them)."""
        target = torch.device(device)
        if self.keys.device == target:
            return self
        # asynchronous only to a GPU: a copy to the host returns with its rows there
        ahead = target.type == "cuda"
        out = replace(self, keys=self.keys.to(target, non_blocking=ahead),
                      values=self.values.to(target, non_blocking=ahead))
        note_copies([self.keys, self.values], target)  # locked: kept till done
        return out

    def with_profile(self, profile: torch.Tensor) -> ChunkKV:
        """The same rows with a profile attached (float32 on the CPU: it is read on the host)."""
        return replace(self, profile=profile.detach().to("cpu", torch.float32).contiguous())
