"""Which chunk tokens blend recomputes.

Static selectors (epic, profile, random) decide before layer 0 and recompute the same tokens
at every layer. Scoring selectors (cacheblend, query) recompute every chunk token until their first
check layer, then keep the top-scoring fraction ``ratio_schedule[i]`` of the chunk tokens at
``check_layers[i]`` (gradual filtering). Suffix tokens are always kept.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from blendrag.config import BlendConfig
from blendrag.engine.fused_kv import FusedKV
from blendrag.prompt import PromptLayout


class Selector:
    """Base: chunk positions to compute from layer 0, and (optionally) filtering at check layers."""

    check_layers: tuple[int, ...] = ()

    def __init__(self, config: BlendConfig, layout: PromptLayout, device: torch.device,
                 scaling: float) -> None:
        self.config = config
        self.scaling = scaling
        self.layout = layout
        self.device = device
        start, end = len(layout.prefix_ids), layout.suffix_start
        self.chunk_positions = torch.arange(start, end, device=device)  # [C]
        self.num_chunk_tokens = end - start

    def initial(self) -> torch.Tensor:
        """Chunk positions computed from layer 0 on (sorted)."""
        return self.chunk_positions

    def keep(self, step: int, layer: int, pos: torch.Tensor, q: torch.Tensor, k_new: torch.Tensor,
             v_new: torch.Tensor, k_old: torch.Tensor, v_old: torch.Tensor, fused: FusedKV, n: int
             ) -> torch.Tensor:
        """Indices into ``pos`` of the tokens that go on computing after check layer ``layer``."""
        raise NotImplementedError


class EpicSelector(Selector):
    """First ceil(ratio * len) tokens of every chunk (EPIC / LegoLink attention-sink repair)."""

    def initial(self) -> torch.Tensor:
        picks = [torch.arange(s, s + math.ceil(self.config.ratio * (e - s) - 1e-9), device=self.device)
                 for s, e in self.layout.chunk_spans]
        return torch.cat(picks)


class RandomSelector(Selector):
    """ceil(ratio * C) uniformly random chunk tokens, seeded (ablation)."""

    def initial(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.config.seed)
        count = math.ceil(self.config.ratio * self.num_chunk_tokens - 1e-9)
        chosen = torch.randperm(self.num_chunk_tokens, generator=g)[:count].sort().values
        return self.chunk_positions[chosen.to(self.device)]


class ProfileSelector(Selector):
    """The top ceil(ratio * C) chunk tokens by their stored context-sensitivity profile, ranked
    across all chunks (engine/profile.py). The first chunk is left out when it follows the very
    prefix it was computed after: its cached rows are then exact."""

    def __init__(self, config: BlendConfig, layout: PromptLayout, device: torch.device, scaling: float,
                 profiles: Sequence[torch.Tensor | None] = ()) -> None:
        super().__init__(config, layout, device, scaling)
        if len(profiles) != len(layout.chunk_spans) or any(p is None for p in profiles):
            raise ValueError("the profile selector needs a sensitivity profile for every chunk "
                             "(BlendEngine fills them in; got chunk KVs without one)")
        scores = torch.cat([p.float() for p in profiles])  # [C] on the CPU
        if layout.chunk_prefix_ids == layout.prefix_ids and layout.chunk_spans:
            first = layout.chunk_spans[0][1] - layout.chunk_spans[0][0]
            scores[:first] = -1.0  # exact rows: chosen last, only if the budget exceeds the rest
        self.scores = scores

    def initial(self) -> torch.Tensor:
        count = math.ceil(self.config.ratio * self.num_chunk_tokens - 1e-9)
        chosen = torch.topk(self.scores, count).indices.sort().values
        return self.chunk_positions[chosen.to(self.device)]


class ScoringSelector(Selector):
    """Keeps the top-scoring chunk tokens at each check layer; subclasses define the score."""

    def __init__(self, config: BlendConfig, layout: PromptLayout, device: torch.device,
                 scaling: float) -> None:
        super().__init__(config, layout, device, scaling)
        self.check_layers = config.check_layers

    def initial(self) -> torch.Tensor:
        # Every token before the first check, the (exact, cached) prefix included: a complete
        # causal block takes the fast attention path, and the prefix is a few % of the prompt.
        return torch.arange(0, self.layout.suffix_start, device=self.device)

    def budget(self, step: int) -> int:
        """Chunk tokens kept at check ``step``: ceil(ratio_schedule[step] x chunk tokens)."""
        return math.ceil(self.config.ratio_schedule[step] * self.num_chunk_tokens - 1e-9)

    def keep(self, step, layer, pos, q, k_new, v_new, k_old, v_old, fused, n):
        is_chunk = (pos >= self.chunk_positions[0]) & (pos < self.layout.suffix_start)  # [A]
        scores = self.score(pos, q, k_new, v_new, k_old, v_old, fused, layer, n)  # [A]
        scores = scores.float().masked_fill(~is_chunk, float("-inf"))
        budget = min(self.budget(step), int(is_chunk.sum()))
        top = torch.topk(scores, budget).indices if budget else torch.empty(0, dtype=torch.long, device=pos.device)
        suffix = torch.nonzero(pos >= self.layout.suffix_start).flatten()
        return torch.cat([top, suffix]).sort().values

    def score(self, pos, q, k_new, v_new, k_old, v_old, fused, layer, n) -> torch.Tensor:
        raise NotImplementedError


class CacheBlendSelector(ScoringSelector):
    """KV deviation: squared L2 between fresh and cached V (or rotated K), summed over heads."""

    def __init__(self, config: BlendConfig, layout: PromptLayout, device: torch.device,
                 scaling: float) -> None:
        if config.check_layers[0] < 1:
            raise ValueError("cacheblend check layers must be >= 1: at layer 0 K/V depend only on the "
                             "token and its position, so fresh and cached rows are equal there")
        super().__init__(config, layout, device, scaling)

    def score(self, pos, q, k_new, v_new, k_old, v_old, fused, layer, n):
        new, old = (v_new, v_old) if self.config.deviation == "value" else (k_new, k_old)
        return (new.float() - old.float()).pow(2).sum(dim=(0, 2))  # [A]


class QuerySelector(ScoringSelector):
    """Attention the suffix (question) tokens pay each chunk token, summed over heads and
    suffix queries (A³ / ProphetKV style)."""

    def score(self, pos, q, k_new, v_new, k_old, v_old, fused, layer, n):
        suffix_rows = pos >= self.layout.suffix_start
        qs = q[:, suffix_rows].float()  # [H, S, D]
        keys = fused.k[layer, :, :n].float()  # [Hkv, n, D], fresh rows already written
        keys = keys.repeat_interleave(qs.shape[0] // keys.shape[0], dim=0)  # [H, n, D]
        logits = qs @ keys.transpose(1, 2) * self.scaling  # [H, S, n]
        visible = torch.arange(n, device=pos.device)[None] <= pos[suffix_rows][:, None]  # [S, n]
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
        per_key = probs.sum(dim=(0, 1))  # [n]
        return per_key[pos]  # [A]


SELECTORS: dict[str, type[Selector]] = {
    "cacheblend": CacheBlendSelector,
    "epic": EpicSelector,
    "profile": ProfileSelector,
    "query": QuerySelector,
    "random": RandomSelector,
}


def make_selector(config: BlendConfig, layout: PromptLayout, num_layers: int, device: torch.device,
                  scaling: float, profiles: Sequence[torch.Tensor | None] = ()) -> Selector:
    """The selector of ``config``; its check layers must exist in the model. ``profiles``: the
    chunks' sensitivity profiles, in prompt order (profile selector only)."""
    if config.selector in ("cacheblend", "query") and config.check_layers[-1] >= num_layers:
        raise ValueError(f"check_layers {config.check_layers} exceed the model's {num_layers} layers")
    if config.selector == "profile":
        return ProfileSelector(config, layout, device, scaling, profiles)
    return SELECTORS[config.selector](config, layout, device, scaling)
