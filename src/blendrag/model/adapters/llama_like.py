"""Families with Llama's layer: Mistral, Qwen2, Qwen3 (they differ in windows and q/k norm)."""

from __future__ import annotations

import torch

from blendrag.model.adapters.base import HFModule, LlamaAdapter


class MistralAdapter(LlamaAdapter):
    """Mistral: Llama plus an optional sliding window on every layer."""

    family = "mistral"

    def sliding_window(self, layer_idx: int) -> int | None:
        return getattr(self.config, "sliding_window", None)


class Qwen2Adapter(LlamaAdapter):
    """Qwen2: q/k/v biases (in the modules) and sliding windows on layers marked so."""

    family = "qwen2"

    def sliding_window(self, layer_idx: int) -> int | None:
        types = getattr(self.config, "layer_types", None)
        if types is not None and types[layer_idx] == "sliding_attention":
            return self.config.sliding_window
        return None


class Qwen3Adapter(Qwen2Adapter):
    """Qwen3: RMSNorm over head_dim on q and k, before RoPE."""

    family = "qwen3"

    def qk_norm(
        self, attn: HFModule, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return attn.q_norm(q), attn.k_norm(k)
