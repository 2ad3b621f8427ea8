"""How far a mode's attention is from a full prefill's (CacheBlend's "attention deviation").

For every layer, the suffix (question) tokens' attention distributions over the prompt are
computed from the mode's fused KV and compared with the full prefill's: the deviation is the
mean L1 distance between the distributions (0 = identical, 2 = disjoint), averaged over
suffix tokens and layers.
"""

from __future__ import annotations

import torch

from blendrag.config import BlendConfig
from blendrag.engine import BlendEngine, Prefill
from blendrag.engine.compute.layer import attention_probs
from blendrag.engine.compute.observers import Trace
from blendrag.prompt import PromptLayout


def suffix_attention(engine: BlendEngine, pre: Prefill, trace: Trace, layout: PromptLayout,
                     layer: int) -> torch.Tensor:
    """Attention probabilities of the suffix queries at ``layer``: [H, S, N] (float32), from a
    prefill ``pre`` and the ``trace`` of its layers."""
    step = trace.layers[layer]  # the queries of the tokens computed at that layer
    rows = step["pos"] >= layout.suffix_start
    keys = pre.fused.k[layer, :, :layout.num_tokens]  # [Hkv, N, D]
    return attention_probs(step["q"][:, rows], keys, step["pos"][rows], engine.adapter.scaling,
                           softcap=engine.adapter.attn_softcap)


def traced_prefill(engine: BlendEngine, layout: PromptLayout,
                   config: BlendConfig) -> tuple[Prefill, Trace]:
    """A prefill of ``layout`` in ``config`` with the trace of its layers."""
    trace = Trace()
    return engine.prefill(layout, config, observers=[trace]), trace


@torch.inference_mode()
def attention_deviation(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
                        reference: tuple[Prefill, Trace] | None = None) -> float:
    """Mean L1 distance of suffix attention between ``config`` and a full prefill
    (``reference``: the full prefill's ``traced_prefill``, made now when not given)."""
    ref, ref_trace = reference or traced_prefill(engine, layout, BlendConfig(mode="full"))
    pre, trace = traced_prefill(engine, layout, config)
    total = 0.0
    for layer in range(engine.adapter.num_layers):
        a = suffix_attention(engine, pre, trace, layout, layer)
        b = suffix_attention(engine, ref, ref_trace, layout, layer)
        total += (a - b).abs().sum(-1).mean().item()
    return total / engine.adapter.num_layers
