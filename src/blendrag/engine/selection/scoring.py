"""The scoring selectors: CacheBlend's (the deviation of fresh from cached rows) and the
question's attention (``query``). Each recomputes every token before its first check layer, then
keeps the top-scoring fraction ``ratio_schedule[i]`` of the chunk tokens at ``check_layers[i]``
(gradual filtering, CacheBlend §4.2); suffix tokens are always kept."""

from __future__ import annotations

import torch

from blendrag.config import BlendConfig, CacheBlendOptions, CheckLayerOptions, QueryOptions
from blendrag.engine.compute.layer import attention_probs
from blendrag.engine.selection.selectors import CheckView, Selector, SelectorInputs, implements


class ScoringSelector(Selector):
    """Keeps the top-scoring chunk tokens at each check layer; subclasses define the score."""

    def __init__(self, config: BlendConfig, inputs: SelectorInputs) -> None:
        super().__init__(config, inputs)
        self.check_layers = config.typed_options(CheckLayerOptions).check_layers
        self.schedule = config.schedule
        self._chunk_tokens = self.num_chunk_tokens  # chunk tokens computed until the next check

    def initial(self) -> torch.Tensor:
        # Every token before the first check, the (exact, cached) prefix included: a complete
        # causal block takes the fast attention path, and the prefix is a few % of the prompt.
        self._chunk_tokens = self.num_chunk_tokens
        return torch.arange(0, self.layout.suffix_start, device=self.device)

    def budget(self, step: int) -> int:
        """Chunk tokens kept at check ``step``: ceil(ratio_schedule[step] x chunk tokens)."""
        return self.budget_of(self.schedule[step])

    def keep(self, view: CheckView) -> torch.Tensor:
        # Nothing is read back from the device: the count of chunk tokens still computed is
        # known here, and the suffix tokens, always computed, are the last rows of ``pos``.
        pos, a = view.pos, view.pos.shape[0]
        is_chunk = (pos >= self.chunk_positions[0]) & (pos < self.layout.suffix_start)  # [A]
        scores = self.score(view).float().masked_fill(~is_chunk, float("-inf"))  # [A]
        budget = min(self.budget(view.step), self._chunk_tokens)
        self._chunk_tokens = budget
        top = torch.topk(scores, budget).indices  # [budget]
        suffix = torch.arange(a - (self.layout.num_tokens - self.layout.suffix_start), a,
                              device=pos.device)
        return torch.cat([top, suffix]).sort().values

    def score(self, view: CheckView) -> torch.Tensor:
        """One score per active token ([A]); the top chunk tokens are kept."""
        raise NotImplementedError


@implements(CacheBlendOptions)
class CacheBlendSelector(ScoringSelector):
    """KV deviation: squared L2 between fresh and cached V (or rotated K), summed over heads."""

    def __init__(self, config: BlendConfig, inputs: SelectorInputs) -> None:
        if config.typed_options(CacheBlendOptions).check_layers[0] < 1:
            raise ValueError("cacheblend check layers must be >= 1: at layer 0 K/V depend only on "
                             "the token and its position, so fresh and cached rows are equal there")
        super().__init__(config, inputs)

    def score(self, view: CheckView) -> torch.Tensor:
        value = self.config.typed_options(CacheBlendOptions).deviation == "value"
        new, old = (view.v_new, view.v_old) if value else (view.k_new, view.k_old)
        return (new.float() - old.float()).pow(2).sum(dim=(0, 2))  # [A]


@implements(QueryOptions)
class QuerySelector(ScoringSelector):
    """Attention the suffix (question) tokens pay each chunk token, summed over heads and
    suffix queries (A³ / ProphetKV style)."""

    def score(self, view: CheckView) -> torch.Tensor:
        pos = view.pos
        s = self.layout.num_tokens - self.layout.suffix_start  # the suffix: the last rows
        keys = view.fused.k[view.layer, :, :view.n]  # [Hkv, n, D], fresh rows already written
        # [H, S, n]
        probs = attention_probs(view.q[:, -s:], keys, pos[-s:], self.scaling,
                                softcap=self.softcap)
        per_key = probs.sum(dim=(0, 1))  # [n]
        return per_key[pos]  # [A]
