"""The preview pass of the ``preview`` selector: where does the question look?

Before blending, the suffix (the question and the answer cue) is run alone over the cached
rows, exactly what full KV reuse computes, and the attention its tokens pay each chunk token is
recorded at every layer. Tokens the question reads are the ones whose stale rows would move the
answer; the selector weighs that attention by how far context moves each token
(``ChunkKV.context_shift``). Cost: the suffix's tokens once more at every layer (counted in
``RequestStats.preview_tokens`` and ``compute_fraction``); the request's KV buffer is reused,
as the blend pass rewrites every row of it.
"""

from __future__ import annotations

import torch

from blendrag.engine.fused_kv import CachedSegment, FusedKV
from blendrag.engine.layer import attention_probs
from blendrag.engine.prefill import LoopPlan, run_loop
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptLayout


@torch.inference_mode()
def suffix_attention(adapter: LlamaAdapter, layout: PromptLayout, cached: list[CachedSegment],
                     fused: FusedKV, rope: RopeTable) -> torch.Tensor:
    """Attention the suffix pays each chunk token over the cached rows, per layer, summed over
    heads and suffix queries: [layers, C] float32 on the CPU (C: chunk tokens)."""
    n, dev = layout.num_tokens, fused.k.device
    lo, hi = len(layout.prefix_ids), layout.suffix_start
    plan = LoopPlan(torch.tensor(layout.ids, device=dev), cached,
                    torch.arange(hi, n, device=dev))
    out = run_loop(adapter, plan, fused, rope, trace=True)
    rows = []
    for i, step in enumerate(out.trace):
        probs = attention_probs(step["q"], fused.k[i, :, :n], step["pos"], adapter.scaling)
        rows.append(probs[:, :, lo:hi].sum(dim=(0, 1)))  # [C]
    return torch.stack(rows).cpu()
