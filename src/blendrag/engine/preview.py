"""The preview pass of the ``preview`` selector: where does the question look?

Before blending, the suffix (the question and the answer cue) is run alone over the cached
rows, exactly what full KV reuse computes, and the attention its tokens pay each chunk token is
recorded at every layer (computed once: the probabilities the layer's output is made of).
Tokens the question reads are the ones whose stale rows would move the
answer; the selector weighs that attention by how far context moves each token
(``ChunkKV.context_shift``). Cost: the suffix's tokens once more at every layer (counted in
``RequestStats.preview_tokens`` and ``compute_fraction``). The pass runs in the request's KV
buffer: the cached rows it loads stay for the blend pass, and the suffix rows it writes are
ones the blend pass computes again.
"""

from __future__ import annotations

import torch

from blendrag.engine.fused_kv import CachedSegment, FusedKV
from blendrag.engine.layer_feed import LayerFeed
from blendrag.engine.prefill import LoopPlan, run_loop
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTable
from blendrag.prompt import PromptLayout


@torch.inference_mode()
def suffix_attention(adapter: LlamaAdapter, layout: PromptLayout, cached: list[CachedSegment],
                     fused: FusedKV, rope: RopeTable,
                     feed: LayerFeed | None = None) -> tuple[torch.Tensor, int, float]:
    """Attention the suffix pays each chunk token over the cached rows, per layer, summed over
    heads and suffix queries: [layers, C] float32 on the CPU (C: chunk tokens), the keys the
    pass attended to over all layers (its attention work), and its time copying cached rows.
    Leaves the cached rows loaded in ``fused`` (the blend pass need not load them again): the
    pass is the consumer of ``feed``, so with pipelined loading it overlaps the loading of the
    cached rows, and the blend pass after it has nothing left to overlap."""
    n, dev = layout.num_tokens, fused.k.device
    lo, hi = len(layout.prefix_ids), layout.suffix_start
    plan = LoopPlan(torch.tensor(layout.ids, device=dev), cached,
                    torch.arange(hi, n, device=dev), score_range=(lo, hi), feed=feed)
    out = run_loop(adapter, plan, fused, rope)
    return out.attention.cpu(), sum(out.attended_keys_per_layer), out.load_work_s
