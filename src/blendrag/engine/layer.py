"""One decoder layer, split in two so that blend can choose tokens between the halves.

``project``: norm + q/k/v projections + RoPE for the active tokens.
``attend``:  their attention over the request's fused KV.
``finish``:  o_proj + MLP, with residuals (the family's norm placement: ``adapter.finish``).
All work on a flat list of active tokens ``h: [A, hidden]`` at positions ``pos: [A]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from blendrag.engine.fused_kv import FusedKV
from blendrag.engine.softcap import capped_attention
from blendrag.model.adapters import HFModule, LlamaAdapter
from blendrag.model.rope import RopeTable


def project(adapter: LlamaAdapter, layer: HFModule, h: torch.Tensor, pos: torch.Tensor,
            rope: RopeTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h: [A, hidden] -> q: [H, A, D] rotated, k: [Hkv, A, D] rotated, k_pre: pre-RoPE, v.
    ``rope``: the layer's table."""
    x = adapter.attn_input(layer, h)
    q, k_pre, v = adapter.qkv(layer.self_attn, x)
    return rope.rotate(q, pos), rope.rotate(k_pre, pos), k_pre, v


def attend(adapter: LlamaAdapter, layer_idx: int, q: torch.Tensor, fused: FusedKV,
           blocks: list[AttentionBlock]) -> torch.Tensor:
    """Attention of q: [H, A, D] over the fused KV of ``layer_idx`` -> o: [H, A, D]."""
    k, v = fused.k[layer_idx], fused.v[layer_idx]  # [Hkv, capacity, D]
    cap = adapter.attn_softcap
    if cap is not None:
        if any(b.causal for b in blocks):
            raise ValueError("soft-capped attention needs blocks with their masks: build them "
                             "with attention_blocks(..., masked=True)")
        outs = [capped_attention(q[:, b.rows], k[:, b.keys], v[:, b.keys], b.mask,
                                 adapter.scaling, cap) for b in blocks]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    outs = [
        F.scaled_dot_product_attention(
            q[None, :, b.rows], k[None, :, b.keys], v[None, :, b.keys], attn_mask=b.mask,
            is_causal=b.causal, scale=adapter.scaling, enable_gqa=True)[0]
        for b in blocks
    ]  # each: [H, rows, D]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


def attend_scored(adapter: LlamaAdapter, layer_idx: int, q: torch.Tensor, pos: torch.Tensor,
                  fused: FusedKV, n: int,
                  window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``attend`` for a few queries whose attention is also wanted (the preview pass): the
    probabilities are computed once, explicitly, in float32, and used for both.
    q: [H, A, D] at positions pos: [A] (sorted) over keys [0, n) -> o: [H, A, D] and
    per_key: [n] float32 (the probabilities summed over heads and queries)."""
    k, v = fused.k[layer_idx, :, :n], fused.v[layer_idx, :, :n]  # [Hkv, n, D]
    heads, a, d = q.shape
    probs = attention_probs(q, k, pos, adapter.scaling, window,
                            adapter.attn_softcap)  # [H, A, n]
    o = probs.to(v.dtype).view(k.shape[0], -1, n) @ v  # [Hkv, g*A, D]
    return o.view(heads, a, d), probs.sum(dim=(0, 1))


def finish(adapter: LlamaAdapter, layer: HFModule, h: torch.Tensor,
           o: torch.Tensor) -> torch.Tensor:
    """o_proj of the attention output o: [H, A, D], then the MLP, with residuals and the norms
    where the family has them. -> h: [A, hidden]"""
    attn_out = layer.self_attn.o_proj(o.transpose(0, 1).reshape(h.shape[0], -1))  # [A, hidden]
    return adapter.finish(layer, h, attn_out)


@dataclass
class AttentionBlock:
    """Query rows ``rows`` attend to keys ``keys`` under ``mask`` (or plain causal / no mask)."""

    rows: slice
    keys: slice
    mask: torch.Tensor | None
    causal: bool


def attention_blocks(pos: torch.Tensor, n: int, window: int | None, block: int = 64,
                     masked: bool = False) -> list[AttentionBlock]:
    """Exact attention for queries at ``pos`` (sorted) over keys [0, n): key j is visible iff
    j <= p (and p - j < window). Mask-free fast paths are taken when equivalent. Otherwise the
    queries are cut into position-sorted blocks that only see keys up to their own last
    position: CPU kernels cannot skip masked blocks, so this removes most of the masked work
    for scattered (blend) queries. Blocks of 64 rows: smaller blocks mask less but make more
    kernel calls, which cost more than the masked work they save (the sizes measured:
    docs/architecture.md, "The fixed cost of a cached request"). ``masked``: no mask-free
    paths, every block has its mask (soft-capped attention, engine/softcap.py, has no causal
    kernel)."""
    a = pos.shape[0]
    if not masked and (window is None or window >= n):
        if a == n:  # every position: plain causal
            return [AttentionBlock(slice(0, a), slice(0, n), None, True)]
        if a == 1 and int(pos[0]) == n - 1:  # one last token sees everything
            return [AttentionBlock(slice(0, 1), slice(0, n), None, False)]
    bounds = pos.tolist()
    out = []
    for start in range(0, a, block):
        stop = min(a, start + block)
        lo = 0 if window is None else max(0, bounds[start] - window + 1)
        hi = bounds[stop - 1] + 1
        k_pos = torch.arange(lo, hi, device=pos.device)
        p = pos[start:stop, None]
        mask = k_pos[None, :] <= p  # [rows, keys]
        if window is not None:
            mask &= k_pos[None, :] > p - window
        out.append(AttentionBlock(slice(start, stop), slice(lo, hi), mask, False))
    return out


def attention_probs(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, scaling: float,
                    window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention probabilities of queries at positions ``q_pos`` over the keys at positions
    [0, n), with the exact causal (and sliding-window) mask, in float32: the preview pass's
    output and scores, a scoring selector's and the evaluation's analysis.
    ``softcap``: the family's attention-logit soft cap (Gemma 2), applied before the mask.
    q: [H, S, D]; k: [Hkv, n, D]; q_pos: [S] -> [H, S, n]."""
    heads, s, d = q.shape
    hkv, n = k.shape[0], k.shape[1]
    # q head h reads kv head h // (heads / hkv): fold each group of q heads into one matmul;
    # the scale goes on q ([H, S, D]) rather than on the [H, S, n] logits
    q = (q.float() * scaling).reshape(hkv, -1, d)
    logits = (q @ k.float().transpose(1, 2)).view(heads, s, n)  # [H, S, n]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    # every key before the first query is visible to all (no window): mask only the rest
    lo = 0 if window is not None else int(q_pos.min()) if s else n
    keys = torch.arange(lo, n, device=q_pos.device)
    hidden = keys[None] > q_pos[:, None]  # [S, n - lo]
    if window is not None:
        hidden |= keys[None] <= q_pos[:, None] - window
    logits[:, :, lo:].masked_fill_(hidden, float("-inf"))
    return logits.softmax(-1)
