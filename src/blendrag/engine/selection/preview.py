"""The preview pass of the ``preview`` selector: where does the question look?

Before blending, the suffix (the question and the answer cue) is run alone over the cached
rows, exactly what full KV reuse computes, and the attention its tokens pay each chunk token is
recorded at every layer (computed once: the probabilities the layer's output is made of).
Tokens the question reads are the ones whose stale rows would move the answer; the selector
weighs that attention by how far context moves each token (``ChunkKV.context_shift``). Cost:
the suffix's tokens once more at every layer (counted in ``preview_tokens`` and
``compute_fraction``). The pass runs in the request's KV buffer: the cached rows it loads stay
for the blend pass, and the suffix rows it writes are ones the blend pass computes again.
"""

from __future__ import annotations

import torch

from blendrag.engine.compute.layer_feed import LayerFeed
from blendrag.engine.compute.loop import LoopPlan
from blendrag.engine.compute.observers import KeyAttention, LayerCounts
from blendrag.prompt import PromptLayout


class PreviewPass:
    """The preview pass over ``layout``'s cached rows, to be run (alone, or packed with other
    requests' passes): its ``plan`` (the suffix computed, over the cached rows ``feed``
    places) and ``observers``; ``result()`` once it has run. It leaves the cached rows loaded
    in the request's buffer: the pass is the consumer of ``feed``, so with pipelined loading it
    overlaps their loading, and the blend pass after it has nothing left to load."""

    def __init__(self, layout: PromptLayout, ids: torch.Tensor,
                 feed: LayerFeed | None) -> None:
        self.attention = KeyAttention(len(layout.prefix_ids), layout.suffix_start)
        self.counts = LayerCounts((0, 0))
        self.plan = LoopPlan(ids, torch.arange(layout.suffix_start, layout.num_tokens,
                                               device=ids.device), feed=feed)

    @property
    def observers(self) -> tuple[KeyAttention, LayerCounts]:
        return self.attention, self.counts

    def result(self) -> torch.Tensor:
        """Attention the suffix paid each chunk token, per layer, summed over heads and suffix
        queries: [layers, C] float32 where the pass ran (C: chunk tokens). Nothing is read
        back: on a GPU the selection is made on the device and the blend pass queued behind
        this one (engine/selection/selectors.py)."""
        return self.attention.attention

    @property
    def attended_keys(self) -> int:
        """The keys the pass attended to over all layers (its attention work): a read of its
        counts, for the stats once the request's logits are ready."""
        return sum(self.counts.attended_keys)
