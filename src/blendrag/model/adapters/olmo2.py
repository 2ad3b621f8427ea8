"""OLMo 2: norms after the sublayers instead of before, q/k norm over the whole projection."""

from __future__ import annotations

import torch

from blendrag.model.adapters.base import HFModule, LlamaAdapter


class Olmo2Adapter(LlamaAdapter):
    """OLMo 2: no input norm; RMSNorm over all of q's (and k's) projection, before it is cut
    into heads; the attention output and the MLP output each normed before joining the
    residual stream."""

    family = "olmo2"

    def attn_input(self, layer: HFModule, h: torch.Tensor) -> torch.Tensor:
        return h

    def qkv(self, attn: HFModule,
            x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = x.shape[0]
        q = attn.q_norm(attn.q_proj(x)).view(a, -1, self.head_dim)  # [A, H, D]
        k = attn.k_norm(attn.k_proj(x)).view(a, -1, self.head_dim)  # [A, Hkv, D]
        v = attn.v_proj(x).view(a, -1, self.head_dim)  # [A, Hkv, D]
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)

    def finish(self, layer: HFModule, h: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        h = h + layer.post_attention_layernorm(attn_out)
        return h + layer.post_feedforward_layernorm(layer.mlp(h))
