"""Attention with soft-capped logits (Gemma 2): ``tanh(s / cap) * cap`` before the softmax.

No fused kernel caps the logits, so these few layers take the explicit path, with the
operations of HF's eager attention in its order and dtypes (logits and cap in the model's
dtype, softmax in float32, back to the model's dtype for the values), so that it matches HF's
forward to the last bits.
"""

from __future__ import annotations

import torch


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     mask: torch.Tensor | None, scaling: float, cap: float) -> torch.Tensor:
    """q: [H, R, D] over k, v: [Hkv, K, D], mask: [R, K] (True: visible; None: all) ->
    o: [H, R, D]."""
    heads, r, d = q.shape
    hkv, keys = k.shape[0], k.shape[1]
    # q head h reads kv head h // (H / Hkv): fold each group of q heads into one matmul
    logits = (q.reshape(hkv, -1, d) @ k.transpose(1, 2)).view(heads, r, keys) * scaling
    logits = torch.tanh(logits / cap) * cap  # [H, R, K]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    probs = logits.softmax(dim=-1, dtype=torch.float32).to(q.dtype)  # [H, R, K]
    return (probs.view(hkv, -1, keys) @ v).view(heads, r, d)


def capped_attention_batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             mask: torch.Tensor, scaling: float, cap: float) -> torch.Tensor:
    """``capped_attention`` for a batch, each row over its own keys, in the same order and
    dtypes: q: [B, Hkv, g, D] over k, v: [B, Hkv, K, D], mask: [B, 1, 1, K] (True: visible)
    -> o: [B, Hkv, g, D]."""
    logits = (q @ k.transpose(-1, -2)) * scaling  # [B, Hkv, g, K]
    logits = torch.tanh(logits / cap) * cap
    logits = logits.masked_fill(~mask, float("-inf"))
    probs = logits.softmax(dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v
