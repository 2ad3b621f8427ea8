"""How far a mode's attention is from a full prefill's (CacheBlend's "attention deviation").

For every layer, the suffix (question) tokens' attention distributions over the prompt are
computed from the mode's fused KV and compared with the full prefill's: the deviation is the
mean L1 distance between the distributions (0 = identical, 2 = disjoint), averaged over
suffix tokens and layers.
"""

from __future__ import annotations

import torch

from blendrag.config import BlendConfig
from blendrag.engine.engine import BlendEngine, Prefill
from blendrag.engine.layer import attention_probs
from blendrag.prompt import PromptLayout


def suffix_attention(engine: BlendEngine, pre: Prefill, layout: PromptLayout,
                     layer: int) -> torch.Tensor:
    """Attention probabilities of the suffix queries at ``layer``: [H, S, N] (float32)."""
    step = pre.output.trace[layer]  # the queries of the tokens computed at that layer
    rows = step["pos"] >= layout.suffix_start
    keys = pre.fused.k[layer, :, :layout.num_tokens]  # [Hkv, N, D]
    return attention_probs(step["q"][:, rows], keys, step["pos"][rows], engine.adapter.scaling)


@torch.inference_mode()
def attention_deviation(engine: BlendEngine, layout: PromptLayout, config: BlendConfig,
                        reference: Prefill | None = None) -> float:
    """Mean L1 distance of suffix attention between ``config`` and a full prefill."""
    ref = reference or engine.prefill(layout, BlendConfig(mode="full"), trace=True)
    pre = engine.prefill(layout, config, trace=True)
    total = 0.0
    for layer in range(engine.adapter.num_layers):
        a = suffix_attention(engine, pre, layout, layer)
        b = suffix_attention(engine, ref, layout, layer)
        total += (a - b).abs().sum(-1).mean().item()
    return total / engine.adapter.num_layers
