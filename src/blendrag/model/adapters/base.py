"""The Llama adapter: the layout every family shares, and the hooks a family refines.

The engine runs its own layer loop over the HF modules (embed_tokens, layers[i].self_attn.
{q,k,v,o}_proj, the layer's norms, mlp, norm, lm_head, rotary_emb). What differs between
families is asked of the adapter, never tested in the engine: how a layer turns hidden states
into q/k/v (``attn_input``, ``qkv``), how it adds the attention output and the MLP to the
residual stream (``finish``), which layers use a sliding window (``sliding_window``), which
RoPE table each layer rotates with (``rope_kind``, ``rotary_for``), the attention-logit soft
cap (``attn_softcap``) and the logits (``logits``). A config feature the engine cannot run
exactly is refused by name (``check``), never run wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from blendrag.model.rope import RopeTable, RopeTables

HFModule = Any
"""An HF module read through the attributes its family defines (``layers[i].self_attn.q_proj``,
``input_layernorm``, ...): torch types such attribute reads as ``Tensor | Module``, so they are
typed ``Any`` here, in the one place that knows each family's names."""

Rotary = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(probe, positions [1, n]) -> cos, sin: [1, n, rotary_dim] in the probe's dtype."""

KNOWN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class LlamaAdapter:
    """Llama (incl. rope_scaling llama3/linear/yarn/dynamic). GQA, biases and tied embeddings are
    handled by the modules themselves."""

    family = "llama"
    attn_softcap: float | None = None
    """Soft cap of the attention logits, ``tanh(s / cap) * cap`` before the softmax (Gemma 2);
    None: plain softmax attention."""
    context_note = ""
    """Why the engine's context (``max_positions``) is shorter than the config's, when it is."""

    def __init__(self, model: HFModule) -> None:
        base: HFModule = model.model
        self.model: HFModule = model
        self.config: Any = model.config
        self.embed: HFModule = base.embed_tokens  # Gemma's scale by sqrt(hidden) is inside it
        self.layers: HFModule = base.layers  # the decoder layers, in order
        self.norm: HFModule = base.norm
        self.lm_head: HFModule = model.lm_head
        self.rotary: HFModule = base.rotary_emb
        attn = self.layers[0].self_attn
        self.head_dim: int = attn.head_dim
        self.scaling: float = attn.scaling  # Gemma's query_pre_attn_scalar is in it
        self.num_heads: int = self.config.num_attention_heads
        self.num_kv_heads: int = self.config.num_key_value_heads
        self.num_layers: int = len(self.layers)
        self.max_positions: int = int(self.config.max_position_embeddings)
        self.check()

    # ---- what the family can run -------------------------------------------------------------

    def check(self) -> None:
        """ValueError naming a config feature the engine would not run exactly."""
        types = getattr(self.config, "layer_types", None) or ()
        unknown = sorted(set(types) - KNOWN_LAYER_TYPES)
        if unknown:
            raise ValueError(f"{self.family}: layer types {unknown} are not supported (blendrag "
                             f"runs {sorted(KNOWN_LAYER_TYPES)} layers)")

    # ---- one layer ---------------------------------------------------------------------------

    def attn_input(self, layer: HFModule, h: torch.Tensor) -> torch.Tensor:
        """h: [A, hidden] -> the attention's input [A, hidden] (the pre-attention norm)."""
        return layer.input_layernorm(h)

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
        """q: [A, H, D], k: [A, Hkv, D] -> the same, normed where the family norms them."""
        return q, k

    def finish(self, layer: HFModule, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The residual stream after the layer: h, attn_out (o_proj's output): [A, hidden]."""
        h = h + attn_out
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def sliding_window(self, layer_idx: int) -> int | None:
        """The layer's window (a query at p sees keys j with p - j < window); None: causal."""
        return None

    # ---- RoPE and logits ---------------------------------------------------------------------

    def rope_kind(self, layer_idx: int) -> str:
        """Which RoPE table the layer rotates with: layers of one kind share one table."""
        return "all"

    def rotary_for(self, kind: str) -> Rotary:
        """The model's rotary embedding of layers of ``kind``."""
        return self.rotary

    def rope(self, n: int, dtype: torch.dtype, device: torch.device,
             start: int = 0) -> RopeTables:
        """cos/sin of positions [start, n) for every layer, one table per kind of layer."""
        tables: dict[str, RopeTable] = {}
        for i in range(self.num_layers):
            kind = self.rope_kind(i)
            if kind not in tables:
                tables[kind] = RopeTable(self.rotary_for(kind), n, dtype, device, start)
        return RopeTables([tables[self.rope_kind(i)] for i in range(self.num_layers)])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [A, hidden] (final-normed) -> logits [A, vocab] in the model's dtype."""
        return self.lm_head(hidden)
