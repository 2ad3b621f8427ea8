"""One small adapter per model family: the only architecture-specific code in blendrag.

The engine runs its own layer loop over the HF modules (embed_tokens, layers[i].self_attn.
{q,k,v,o}_proj, input/post_attention_layernorm, mlp, norm, lm_head, rotary_emb); an adapter
says how a family turns hidden states into q/k/v and which layers use a sliding window.
"""

from __future__ import annotations

from typing import Any

import torch

HFModule = Any
"""An HF module read through the attributes its family defines (``layers[i].self_attn.q_proj``,
``input_layernorm``, ...): torch types such attribute reads as ``Tensor | Module``, so they are
typed ``Any`` here, in the one place that knows each family's names."""


class LlamaAdapter:
    """Llama (incl. rope_scaling llama3/linear/yarn/dynamic). GQA, biases and tied embeddings are
    handled by the modules themselves."""

    family = "llama"

    def __init__(self, model: HFModule) -> None:
        base: HFModule = model.model
        self.model: HFModule = model
        self.config: Any = model.config
        self.embed: HFModule = base.embed_tokens
        self.layers: HFModule = base.layers  # the decoder layers, in order
        self.norm: HFModule = base.norm
        self.lm_head: HFModule = model.lm_head
        self.rotary: HFModule = base.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim: int = attn.head_dim
        self.scaling: float = attn.scaling
        self.num_heads: int = self.config.num_attention_heads
        self.num_kv_heads: int = self.config.num_key_value_heads
        self.num_layers: int = len(self.layers)
        self.max_positions: int = int(self.config.max_position_embeddings)

    def qkv(self, attn: HFModule,
            x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [A, hidden] -> q: [H, A, D], k: [Hkv, A, D] (pre-RoPE), v: [Hkv, A, D]."""
        a = x.shape[0]
        q = attn.q_proj(x).view(a, -1, self.head_dim)
        k = attn.k_proj(x).view(a, -1, self.head_dim)
        v = attn.v_proj(x).view(a, -1, self.head_dim)
        q, k = self.qk_norm(attn, q, k)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def qk_norm(
        self, attn: HFModule, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def sliding_window(self, layer_idx: int) -> int | None:
        return None


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


ADAPTERS: dict[str, type[LlamaAdapter]] = {
    "LlamaForCausalLM": LlamaAdapter,
    "MistralForCausalLM": MistralAdapter,
    "Qwen2ForCausalLM": Qwen2Adapter,
    "Qwen3ForCausalLM": Qwen3Adapter,
}


def adapter_for(model: HFModule) -> LlamaAdapter:
    """The adapter of ``model``'s family; ValueError listing the supported ones otherwise."""
    name = type(model).__name__
    if name not in ADAPTERS:
        raise ValueError(
            f"unsupported architecture {name!r}; blendrag supports {', '.join(sorted(ADAPTERS))}"
        )
    return ADAPTERS[name](model)
