"""One decoder layer, split in two so that blend can choose tokens between the halves.

``project``: norm + q/k/v projections + RoPE for the active tokens.
``finish``:  attention over the request's fused KV + o_proj + MLP, with residuals.
Both work on a flat list of active tokens ``h: [A, hidden]`` at positions ``pos: [A]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blendrag.engine.fused_kv import FusedKV
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTable


def project(adapter: LlamaAdapter, layer: torch.nn.Module, h: torch.Tensor, pos: torch.Tensor,
            rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h: [A, hidden] -> q: [H, A, D] rotated, k: [Hkv, A, D] rotated, k_pre: pre-RoPE, v."""
    x = layer.input_layernorm(h)
    q, k_pre, v = adapter.qkv(layer.self_attn, x)
    return rope.rotate(q, pos), rope.rotate(k_pre, pos), k_pre, v


def finish(adapter: LlamaAdapter, layer: torch.nn.Module, layer_idx: int, h: torch.Tensor,
           q: torch.Tensor, fused: FusedKV, n: int, mask: torch.Tensor | None, causal: bool) -> torch.Tensor:
    """Attention of q over fused rows [0, n), then o_proj and the MLP. Returns h: [A, hidden]."""
    k, v = fused.rows(layer_idx, n)  # [Hkv, n, D]
    o = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, is_causal=causal,
        scale=adapter.scaling, enable_gqa=True,
    )[0]  # o: [H, A, D]
    h = h + layer.self_attn.o_proj(o.transpose(0, 1).reshape(h.shape[0], -1))
    return h + layer.mlp(layer.post_attention_layernorm(h))


def attention_mask(pos: torch.Tensor, n: int, window: int | None) -> tuple[torch.Tensor | None, bool]:
    """Exact mask for queries at ``pos`` over keys [0, n): key j visible iff j <= p (and within
    the sliding window). Returns (mask, is_causal); the mask-free fast paths are taken only when
    they are equivalent."""
    full_window = window is None or window >= n
    a = pos.shape[0]
    if full_window and a == n:  # pos == arange(n): plain causal
        return None, True
    if full_window and a == 1 and int(pos[0]) == n - 1:  # a last token sees everything
        return None, False
    k_pos = torch.arange(n, device=pos.device)
    mask = k_pos[None, :] <= pos[:, None]  # [A, n]
    if window is not None:
        mask &= k_pos[None, :] > pos[:, None] - window
    return mask, False
