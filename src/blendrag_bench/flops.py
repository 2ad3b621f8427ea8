"""The compute ideal of a request: its arithmetic against a full prefill's, on the same model.

A token computed at a layer costs the layer's matmuls (2 FLOPs per weight of q/k/v/o and the
MLP), plus 4 * heads * head_dim FLOPs per key it attends to (scores and the weighted sum of
values). A mode's ideal speedup is full prefill's FLOPs over its own: what it would reach if
every kernel ran at the same FLOP rate and nothing else cost time (loading and rotating cached
rows, choosing tokens, allocating). Counting tokens only overstates the ideal: a suffix token
attends to every cached key, and on a narrow model (hidden 512) attention over 3,168 keys costs
as much as the token's matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blendrag.engine.request.stats import RequestStats
from blendrag.model.adapters import LlamaAdapter


@dataclass(frozen=True)
class FlopModel:
    """per_token: matmul FLOPs of one token at one layer; per_key: attention FLOPs of one
    query-key pair at one layer."""

    per_token: int
    per_key: int

    @classmethod
    def of(cls, adapter: LlamaAdapter) -> FlopModel:
        layer = adapter.layers[0]
        weights = sum(m.weight.numel() for m in layer.modules()
                      if isinstance(m, torch.nn.Linear))
        return cls(2 * weights, 4 * adapter.num_heads * adapter.head_dim)

    def request(self, stats: RequestStats) -> float:
        """FLOPs of a prefilled request (its preview pass included), from its stats."""
        c = stats.compute
        tokens = sum(c.computed_per_layer) + c.preview_tokens * c.layers
        keys = sum(c.attended_keys_per_layer) + c.preview_attended_keys
        return float(tokens * self.per_token + keys * self.per_key)
