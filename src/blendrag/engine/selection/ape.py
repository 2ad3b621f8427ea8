"""APE on blend's reused rows (``BlendConfig(ape=Ape(temperature, scale))``).

APE (Adaptive Parallel Encoding, ICLR 2025) reads contexts encoded apart, as blend's cached
chunks are, with the question's attention to them sharpened and reweighted: for a query of the
question or of the answer, the logit of a reused key is divided by the temperature T and its
weight multiplied by the scale S (log S added to the logit), and one softmax runs over every
key, the prefix and the query's own tokens unchanged. Here "reused" is per layer: the chunk
rows that layer did not recompute (a recomputed row is exact and is left alone, so at ratio
1.0 nothing changes and blend stays exact).

The suffix's rows of a blend (or reuse) pass and every decoded token attend this way, in
float32 and explicitly (the per-key temperature is not a mask any fused kernel takes); the
recomputed chunk tokens attend as they always do. A request that uses APE decodes eagerly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from blendrag.config import Ape
from blendrag.engine.compute.attention import AttentionPlan, plan_attention


@dataclass(frozen=True)
class ApeSpan:
    """APE's settings and the request's chunk rows [chunk_start, suffix_start)."""

    ape: Ape
    chunk_start: int
    suffix_start: int

    def stale(self, computed: torch.Tensor, n: int) -> torch.Tensor:
        """Keys [0, n) that are reused chunk rows when ``computed`` [A] are recomputed: [n]."""
        out = torch.zeros(n, dtype=torch.bool, device=computed.device)
        out[self.chunk_start:self.suffix_start] = True
        out[computed] = False
        return out


def ape_bias(q_pos: torch.Tensor, stale: torch.Tensor, ape: Ape,
             window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """What APE does to the logits of queries at ``q_pos`` [S] over keys [0, n) whose reused
    rows are ``stale`` [n]: a multiplier [n] (1/T on reused keys, else 1) and an additive term
    [S, n] (log S on reused keys, -inf where the causal or sliding-window mask hides a key)."""
    n = stale.shape[0]
    keys = torch.arange(n, device=q_pos.device)
    hidden = keys[None] > q_pos[:, None]  # [S, n]
    if window is not None:
        hidden |= keys[None] <= q_pos[:, None] - window
    mult = torch.where(stale, 1.0 / ape.temperature, 1.0).to(torch.float32)  # [n]
    add = torch.where(stale, math.log(ape.scale), 0.0).to(torch.float32)
    return mult, add[None].masked_fill(hidden, float("-inf"))


def ape_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mult: torch.Tensor,
                  add: torch.Tensor, scaling: float) -> torch.Tensor:
    """q: [H, S, D] over k, v: [Hkv, n, D] with ``ape_bias``'s ``mult`` [n] and ``add``
    [S, n], in one float32 softmax -> o: [H, S, D] in q's dtype."""
    heads, s, d = q.shape
    hkv, n = k.shape[0], k.shape[1]
    q32 = q.float().reshape(hkv, -1, d)  # [Hkv, g*S, D]: the q heads of one KV head
    logits = (q32 @ k.float().transpose(1, 2)) * scaling * mult  # [Hkv, g*S, n]
    logits = logits.view(hkv, -1, s, n) + add  # [Hkv, g, S, n]
    probs = logits.softmax(-1).view(hkv, -1, n)
    o = probs @ v.float()  # [Hkv, g*S, D]
    return o.view(heads, s, d).to(q.dtype)


class ApePlan(AttentionPlan):
    """The active tokens of a blend or reuse pass at positions ``pos`` (sorted): those before
    the suffix through the usual plan, the suffix's with APE over the keys this layer reuses."""

    def __init__(self, pos: torch.Tensor, n: int, window: int | None, kernel: str,
                 dtype: torch.dtype, span: ApeSpan, stale: torch.Tensor) -> None:
        self.n = n
        self.head = int((pos < span.suffix_start).sum())
        self.inner = (plan_attention(pos[:self.head], n, window, kernel, dtype)
                      if self.head else None)
        tail_pos = pos[self.head:]
        self.mult, self.add = ape_bias(tail_pos, stale, span.ape, window)  # once, every layer
        w = n + 1 if window is None else window
        tail = int((tail_pos + 1).clamp(max=w).sum())
        self.attended_keys = tail + (self.inner.attended_keys if self.inner else 0)

    def attend(self, q, k, v, scale):
        n, h = self.n, self.head
        tail = ape_attention(q[:, h:], k[:, :n], v[:, :n], self.mult, self.add, scale)
        if self.inner is None:
            return tail
        return torch.cat([self.inner.attend(q[:, :h], k, v, scale), tail], dim=1)
