"""Phi-3 (Phi-3, Phi-3.5 and Phi-4-mini share its layout): q, k, v fused in one projection."""

from __future__ import annotations

import torch

from blendrag.model.adapters.base import HFModule, LlamaAdapter


class Phi3Adapter(LlamaAdapter):
    """Phi-3: ``qkv_proj`` holds q, k, v one after the other (``gate_up_proj`` is the MLP's own
    business); an optional sliding window on every layer; partial rotary (Phi-4-mini rotates
    the first 3/4 of each head) comes with the rotary embedding's cos/sin and ``RopeTable``
    rotates only those dimensions, as HF does.

    longrope (the 128k models) switches its frequencies with the request's length: short
    factors up to ``original_max_position_embeddings``, long ones past it, for every row. Rows
    cached or precomputed at one length would then be wrong at another, so the engine's context
    is that original length, where the frequencies are fixed and every mode is exact."""

    family = "phi3"

    def __init__(self, model: HFModule) -> None:
        super().__init__(model)
        rope = getattr(self.config, "rope_parameters", None) or {}
        if rope.get("rope_type") == "longrope":
            original = rope.get("original_max_position_embeddings",
                                getattr(self.config, "original_max_position_embeddings", None))
            if original is None:
                raise ValueError("phi3: longrope without original_max_position_embeddings")
            if int(original) < self.max_positions:
                self.max_positions = int(original)
                self.context_note = (f"Phi-3 longrope switches its RoPE frequencies past "
                                     f"{original} positions, which blendrag does not run")

    def qkv(self, attn: HFModule,
            x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, d = x.shape[0], self.head_dim
        q_size, kv_size = self.num_heads * d, self.num_kv_heads * d
        qkv = attn.qkv_proj(x)  # [A, (H + 2 Hkv) D]
        q = qkv[:, :q_size].view(a, -1, d)  # [A, H, D]
        k = qkv[:, q_size:q_size + kv_size].view(a, -1, d)  # [A, Hkv, D]
        v = qkv[:, q_size + kv_size:].view(a, -1, d)  # [A, Hkv, D]
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def sliding_window(self, layer_idx: int) -> int | None:
        return getattr(self.config, "sliding_window", None)
