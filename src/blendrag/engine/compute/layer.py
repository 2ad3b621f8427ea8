"""One decoder layer, split in two so that blend can choose tokens between the halves.

``project``: norm + q/k/v projections + RoPE for the active tokens.
``attend``:  their attention over the request's fused KV.
``finish``:  o_proj + MLP, with residuals (the family's norm placement: ``adapter.finish``).
All work on a flat list of active tokens ``h: [A, hidden]`` at positions ``pos: [A]``.
"""

from __future__ import annotations

import torch

from blendrag.engine.compute.attention import AttentionPlan, score_bias
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.model.adapters import HFModule, LlamaAdapter
from blendrag.model.rope import Rotation


def project(adapter: LlamaAdapter, layer: HFModule, h: torch.Tensor,
            rotation: Rotation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """h: [A, hidden] -> q: [H, A, D] rotated, k: [Hkv, A, D] rotated, k_pre: pre-RoPE, v.
    ``rotation``: RoPE at the tokens' positions, from the layer's table."""
    x = adapter.attn_input(layer, h)
    q, k_pre, v = adapter.qkv(layer.self_attn, x)
    return rotation.rotate(q), rotation.rotate(k_pre), k_pre, v


def attend(adapter: LlamaAdapter, layer_idx: int, q: torch.Tensor, fused: FusedKV,
           plan: AttentionPlan) -> torch.Tensor:
    """Attention of q: [H, A, D] over the fused KV of ``layer_idx`` -> o: [H, A, D], as
    ``plan`` says (engine/compute/attention.py: built once for the positions of q). The plan gets
    the layer's whole buffer (its keys past the prompt are never visible)."""
    k, v = fused.base_layer(layer_idx)
    return plan.attend(q, k, v, adapter.scaling)


def attend_scored(adapter: LlamaAdapter, layer_idx: int, q: torch.Tensor, fused: FusedKV,
                  n: int, bias: torch.Tensor,
                  summed: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``attend`` for a few queries whose attention is also wanted (the preview pass): the
    probabilities are computed once, explicitly, in float32, and used for both.
    q: [H, A, D] over keys [0, n) with ``bias`` (``attention.score_bias`` of their positions)
    -> o: [H, A, D] and per_key: [n] float32 (the probabilities summed over heads and
    queries; None when not ``summed``: a static pass that computes its attention so)."""
    k, v = (x[:, :n] for x in fused.layer(layer_idx))  # [Hkv, n, D]
    heads, a, d = q.shape
    probs = _grouped_probs(q, k, adapter.scaling, adapter.attn_softcap, bias)  # [Hkv, g*A, n]
    o = _as(probs, v.dtype) @ v  # [Hkv, g*A, D]
    return o.view(heads, a, d), probs.sum(dim=(0, 1)) if summed else None


def finish(adapter: LlamaAdapter, layer: HFModule, h: torch.Tensor,
           o: torch.Tensor) -> torch.Tensor:
    """o_proj of the attention output o: [H, A, D], then the MLP, with residuals and the norms
    where the family has them. -> h: [A, hidden]"""
    attn_out = layer.self_attn.o_proj(o.transpose(0, 1).reshape(h.shape[0], -1))  # [A, hidden]
    return adapter.finish(layer, h, attn_out)


def attention_probs(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor | None,
                    scaling: float, window: int | None = None, softcap: float | None = None,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """Attention probabilities of queries at positions ``q_pos`` over the keys at positions
    [0, n), with the exact causal (and sliding-window) mask, in float32: the preview pass's
    output and scores, a scoring selector's and the evaluation's analysis.
    ``softcap``: the family's attention-logit soft cap (Gemma 2), applied before the mask.
    ``bias``: the mask already built for these positions (``attention.score_bias``), in place
    of ``q_pos`` and ``window``.
    q: [H, S, D]; k: [Hkv, n, D]; q_pos: [S] -> [H, S, n]."""
    heads, s, _ = q.shape
    hkv, n = k.shape[0], k.shape[1]
    if bias is None:
        if q_pos is None:
            raise ValueError("attention_probs needs the queries' positions or their bias")
        bias = score_bias(q_pos, n, window, heads // hkv)
    return _grouped_probs(q, k, scaling, softcap, bias).view(heads, s, n)


def _grouped_probs(q: torch.Tensor, k: torch.Tensor, scaling: float, softcap: float | None,
                   bias: torch.Tensor) -> torch.Tensor:
    """``attention_probs`` with the q heads of each KV head folded into one matmul: q: [H, S,
    D] over k: [Hkv, n, D] with ``bias`` [g*S, n] -> [Hkv, g*S, n] float32 (q head h reads KV
    head h // g)."""
    d = q.shape[2]
    q32 = _as(q, torch.float32).reshape(k.shape[0], -1, d)  # [Hkv, g*S, D]
    k32 = _as(k, torch.float32).transpose(1, 2)  # [Hkv, D, n]
    if softcap is None:  # the mask added in the matmul: bias + scaling * q @ k^T
        logits = torch.baddbmm(bias, q32, k32, alpha=scaling)
    else:
        logits = torch.tanh((q32 * scaling) @ k32 / softcap) * softcap + bias
    return logits.softmax(-1)


def _as(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype``, with no conversion at all when it is in it already."""
    return t if t.dtype == dtype else t.to(dtype)
