"""Gemma 2 and Gemma 3: four norms per layer, soft-capped logits, per-layer-type RoPE (Gemma 3).

Both scale the embeddings by sqrt(hidden) inside ``embed_tokens`` and the attention by
``query_pre_attn_scalar`` inside ``attn.scaling``, which the base adapter reads as they are.
"""

from __future__ import annotations

import functools

import torch

from blendrag.model.adapters.base import HFModule, Rotary
from blendrag.model.adapters.llama_like import Qwen2Adapter


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """tanh(x / cap) * cap, in x's dtype and in HF's order of operations."""
    return torch.tanh(x / cap) * cap


class Gemma2Adapter(Qwen2Adapter):
    """Gemma 2: sliding windows on the layers marked so (as Qwen2); the attention output and the
    MLP each normed before they join the residual stream, and a norm before the MLP; attention
    logits and final logits soft-capped."""

    family = "gemma2"

    def __init__(self, model: HFModule) -> None:
        super().__init__(model)
        self.attn_softcap = self.config.attn_logit_softcapping
        self.final_softcap: float | None = self.config.final_logit_softcapping

    def finish(self, layer: HFModule, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        # post_attention_layernorm normalizes the attention output, not the residual: Llama's
        # order runs without error here and is wrong
        h = h + layer.post_attention_layernorm(attn_out)
        mlp = layer.mlp(layer.pre_feedforward_layernorm(h))
        return h + layer.post_feedforward_layernorm(mlp)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # [A, vocab]
        return logits if self.final_softcap is None else softcap(logits, self.final_softcap)


class Gemma3Adapter(Gemma2Adapter):
    """Gemma 3: Gemma 2's layer plus RMSNorm over head_dim on q and k, and one RoPE table per
    layer type (base 10k on sliding layers, 1M on global ones)."""

    family = "gemma3"

    def __init__(self, model: HFModule) -> None:
        super().__init__(model)
        # HF's Gemma 3 attention never passes attn_logit_softcapping on (its config keeps the
        # field): the forward blendrag matches has no attention soft cap
        self.attn_softcap = None

    def check(self) -> None:
        super().check()
        if getattr(self.config, "use_bidirectional_attention", False):
            raise ValueError("gemma3: use_bidirectional_attention (an encoder's attention, e.g. "
                             "EmbeddingGemma) is not supported: blendrag runs causal decoders")

    def qk_norm(
        self, attn: HFModule, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return attn.q_norm(q), attn.k_norm(k)

    def rope_kind(self, layer_idx: int) -> str:
        return str(self.config.layer_types[layer_idx])

    def rotary_for(self, kind: str) -> Rotary:
        # Gemma 3's rotary embedding holds one set of frequencies per layer type
        return functools.partial(self.rotary, layer_type=kind)
