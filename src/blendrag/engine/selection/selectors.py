"""Which chunk tokens blend recomputes: the selectors' base, the registry, and the static
selectors.

Static selectors (preview, epic, profile, random) decide before layer 0 and recompute the same
tokens at every layer. Scoring selectors (cacheblend, query: ``scoring.py``) recompute every
chunk token until their first check layer, then keep the top-scoring fraction
``ratio_schedule[i]`` of the chunk tokens at ``check_layers[i]`` (gradual filtering). Suffix
tokens are always kept. Every selector registers itself with ``@implements``; the package
imports both files, so ``make_selector`` finds each one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from blendrag.config import (
    BlendConfig,
    CheckLayerOptions,
    EpicOptions,
    PreviewOptions,
    ProfileOptions,
    RandomOptions,
    SelectorOptions,
    token_budget,
)
from blendrag.engine.caches.history import HISTORY_TAG
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer_feed import to_device
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.prompt import PromptLayout
from blendrag.store.layered import LayeredEntry

Cached = ChunkKV | LayeredEntry
"""A chunk's cached rows as a selector sees them: their priors (profile, context shift) and
context tag."""


@dataclass(frozen=True)
class CheckView:
    """What a selector sees at a check layer, for the ``A`` tokens still computed there.

    step: index of this layer in ``check_layers``; layer: the layer index.
    pos: [A] positions; q: [H, A, D] rotated queries.
    k_new, v_new: [Hkv, A, D] the keys (rotated) and values just computed.
    k_old, v_old: [Hkv, A, D] the rows the cache held for the same tokens.
    fused: the request's KV, fresh rows of this layer already written; n: prompt length.
    """

    step: int
    layer: int
    pos: torch.Tensor
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    k_old: torch.Tensor
    v_old: torch.Tensor
    fused: FusedKV
    n: int


@dataclass(frozen=True)
class SelectorInputs:
    """What every selector is made from: the request's ``layout``, the ``device``, the model's
    attention ``scaling`` and ``softcap`` (Gemma 2's attention-logit soft cap), the chunks'
    cached rows in prompt order (``chunks``: their priors) and the preview pass's ``attention``
    [layers, C] (the preview selector's)."""

    layout: PromptLayout
    device: torch.device
    scaling: float
    chunks: Sequence[Cached] = ()
    attention: torch.Tensor | None = None
    softcap: float | None = None


REGISTRY: dict[type[SelectorOptions], type[Selector]] = {}
"""The selector class of each options type, filled by ``@implements``: with
``blendrag.config.SELECTORS`` (name -> options type) the one registry of selectors."""

SelectorT = TypeVar("SelectorT", bound="type[Selector]")


def implements(options: type[SelectorOptions]) -> Callable[[SelectorT], SelectorT]:
    """Class decorator: the decorated selector runs configs with ``options``."""
    def register(cls: SelectorT) -> SelectorT:
        REGISTRY[options] = cls
        return cls
    return register


class Selector:
    """Base: chunk positions to compute from layer 0, and (optionally) filtering at check layers."""

    check_layers: tuple[int, ...] = ()

    def __init__(self, config: BlendConfig, inputs: SelectorInputs) -> None:
        self.config = config
        self.scaling, self.softcap = inputs.scaling, inputs.softcap
        self.layout = layout = inputs.layout
        self.device = inputs.device
        start, end = len(layout.prefix_ids), layout.suffix_start
        self.chunk_positions = torch.arange(start, end, device=self.device)  # [C]
        self.num_chunk_tokens = end - start

    def budget_of(self, fraction: float, tokens: int | None = None) -> int:
        """Tokens recomputed for ``fraction`` of ``tokens`` (default: the chunk tokens)."""
        return token_budget(fraction, self.num_chunk_tokens if tokens is None else tokens)

    def initial(self) -> torch.Tensor:
        """Chunk positions computed from layer 0 on (sorted)."""
        return self.chunk_positions

    def keep(self, view: CheckView) -> torch.Tensor:
        """Indices into ``view.pos`` of the tokens that go on computing after this check layer."""
        raise NotImplementedError


@implements(EpicOptions)
class EpicSelector(Selector):
    """First ceil(ratio * len) tokens of every chunk (EPIC / LegoLink attention-sink repair)."""

    def initial(self) -> torch.Tensor:
        picks = [torch.arange(s, s + self.budget_of(self.config.ratio, e - s),
                              device=self.device)
                 for s, e in self.layout.chunk_spans]
        return torch.cat(picks)


@implements(RandomOptions)
class RandomSelector(Selector):
    """ceil(ratio * C) uniformly random chunk tokens, seeded (ablation)."""

    def initial(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.config.typed_options(RandomOptions).seed)
        count = self.budget_of(self.config.ratio)
        chosen = torch.randperm(self.num_chunk_tokens, generator=g)[:count].sort().values
        return self.chunk_positions[to_device(chosen, self.device)]


class StaticTopSelector(Selector):
    """The top ceil(ratio * C) chunk tokens by ``self.scores`` ([C], on the CPU or on the
    device: the preview's, made there, are chosen there, with nothing read back), ranked
    across all chunks, recomputed at every layer."""

    scores: torch.Tensor
    span = 1  # windows of neighbouring tokens (``PreviewOptions.span``)

    def initial(self) -> torch.Tensor:
        count = self.budget_of(self.config.ratio)
        if self.span > 1:  # windows chosen one after another: on the host
            chosen = spans(self.scores.cpu(), count, self.span)
        else:
            chosen = torch.topk(self.scores, count).indices.sort().values  # [count]
        return self.chunk_positions[to_device(chosen, self.device)]


def spans(scores: torch.Tensor, count: int, span: int) -> torch.Tensor:
    """``count`` chunk-token indices (sorted) in windows of ``span`` neighbours around the
    best-scored tokens (``scores``: [C] on the CPU), best first: a token inside a window taken
    opens none of its own, a window overlapping taken ones adds only its new tokens, and the
    last one is cut to the budget (its best-scored new tokens)."""
    c = scores.shape[0]
    before = (span - 1) // 2
    taken = torch.zeros(c, dtype=torch.bool)
    left = count
    for t in torch.argsort(scores, descending=True, stable=True).tolist():  # [C]
        if left <= 0:
            break
        if taken[t]:
            continue
        lo = max(0, min(t - before, c - span))
        fresh = (~taken[lo:lo + span]).nonzero()[:, 0] + lo
        if fresh.numel() > left:
            fresh = fresh[torch.topk(scores[fresh], left).indices]
        taken[fresh] = True
        left -= fresh.numel()
    return taken.nonzero()[:, 0]


def _last_if_exact(scores: torch.Tensor, layout: PromptLayout,
                   chunks: Sequence[Cached]) -> torch.Tensor:
    """``scores`` [C] with the first chunk's tokens ranked last when its cached rows are exact
    (computed right after this very prefix, with no ingestion context): they are chosen only if
    the budget exceeds the rest."""
    if _exact(layout, chunks):
        first = layout.chunk_spans[0][1] - layout.chunk_spans[0][0]
        scores[:first] = -1.0
    return scores


def _exact(layout: PromptLayout, chunks: Sequence[Cached]) -> bool:
    """Whether the first chunk's cached rows are exact: computed right after this very prefix
    with no ingestion context (``ChunkContext.exact_first``, or no context at all)."""
    same_prefix = layout.chunk_prefix_ids == layout.prefix_ids
    return bool(chunks) and same_prefix and not chunks[0].context_tag


def _stored(values: list[torch.Tensor | None], layout: PromptLayout, chunks: Sequence[Cached],
            zeros: Callable[[int], torch.Tensor]) -> list[torch.Tensor] | None:
    """One stored tensor per chunk (a profile, a context shift), or None when a chunk lacks it.
    An exact first chunk is stored without one and needs none: its tokens are ranked last
    whatever it holds, so it gets ``zeros(tokens)``."""
    if len(values) != len(layout.chunk_spans):
        return None
    if values and values[0] is None and _exact(layout, chunks):
        start, end = layout.chunk_spans[0]
        values = [zeros(end - start), *values[1:]]
    values = _history_filled(values, chunks)
    present = [v for v in values if v is not None]
    return present if len(present) == len(values) else None


def _history_filled(values: list[torch.Tensor | None],
                    chunks: Sequence[Cached]) -> list[torch.Tensor | None]:
    """A history chunk (engine/caches/history.py) has no stored prior: its rows were computed in an
    earlier turn, not in an ingestion context. It gets the other chunks' mean (per layer for a
    context shift [L, T], one value for a profile [T]), so that its tokens compete on the
    attention they get rather than on a prior they lack."""
    known = [v.float() for v, c in zip(values, chunks)
             if v is not None and c.context_tag != HISTORY_TAG]
    if not known:
        return values
    mean = torch.stack([v.mean(dim=-1) for v in known]).mean(dim=0)  # [] or [L]
    return [mean[..., None].expand(*mean.shape, c.num_tokens).contiguous()
            if v is None and c.context_tag == HISTORY_TAG else v
            for v, c in zip(values, chunks)]


@implements(ProfileOptions)
class ProfileSelector(StaticTopSelector):
    """The top ceil(ratio * C) chunk tokens by their stored context-sensitivity profile, ranked
    across all chunks (engine/caches/profile.py). The first chunk is left out when its cached rows
    are exact."""

    def __init__(self, config: BlendConfig, inputs: SelectorInputs) -> None:
        super().__init__(config, inputs)
        layout, chunks = inputs.layout, inputs.chunks
        profiles = _stored([kv.profile for kv in chunks], layout, chunks, torch.zeros)
        if profiles is None:
            raise ValueError("the profile selector needs a context-sensitivity profile for every "
                             "chunk "
                             "(BlendEngine fills them in; got chunk KVs without one)")
        self.scores = _last_if_exact(torch.cat([p.float() for p in profiles]), layout,
                                     chunks)  # [C] on the CPU


@implements(PreviewOptions)
class PreviewSelector(StaticTopSelector):
    """blendrag's default. Tokens the question reads whose rows context moves most: the score
    of chunk token t is sum over layers l of (a_l(t) / mean_t a_l + floor) * sqrt(shift_l(t)),
    where a_l is the attention the suffix paid t over the cached rows in the preview pass
    (engine/selection/preview.py) and shift_l the stored context shift (ChunkKV.context_shift; 1 for
    chunks stored without one). ``attention_floor`` keeps tokens that context moves much in
    reach where the preview, made over stale keys, pays them little attention."""

    def __init__(self, config: BlendConfig, inputs: SelectorInputs) -> None:
        super().__init__(config, inputs)
        layout, chunks, attention = inputs.layout, inputs.chunks, inputs.attention
        if attention is None or tuple(attention.shape[1:]) != (self.num_chunk_tokens,):
            raise ValueError("the preview selector needs the preview pass's attention [layers, C]")
        # where the preview ran: on a GPU the scores and the choice are made on the device
        att = attention.float()
        att = att / att.mean(dim=1, keepdim=True).clamp_min(1e-12)  # [L, C], mean 1 per layer
        shifts = _stored([kv.context_shift for kv in chunks], layout, chunks,
                         lambda t: torch.zeros(att.shape[0], t))
        if shifts is not None:  # the stored priors, on the host: sent without a wait
            prior = to_device(torch.cat([s.float() for s in shifts], dim=1).sqrt(),
                              att.device)  # [L, C]
        else:  # a chunk stored without its context: rank by attention alone
            prior = torch.ones_like(att)  # [L, C]
        options = config.typed_options(PreviewOptions)
        floor, self.span = options.attention_floor, options.span
        self.scores = _last_if_exact(((att + floor) * prior).sum(dim=0), layout, chunks)  # [C]


def make_selector(config: BlendConfig, layout: PromptLayout, num_layers: int, device: torch.device,
                  scaling: float, chunks: Sequence[Cached] = (),
                  attention: torch.Tensor | None = None,
                  softcap: float | None = None) -> Selector:
    """The selector of ``config``; its check layers must exist in the model. ``chunks``: the
    chunks' cached KVs in prompt order (their profiles and context shifts); ``attention``: the
    preview pass's [layers, C] (preview selector only); ``softcap``: the model's attention-logit
    soft cap (``adapter.attn_softcap``)."""
    options = config.options
    if isinstance(options, CheckLayerOptions) and options.check_layers[-1] >= num_layers:
        raise ValueError(f"check_layers {options.check_layers} exceed the model's {num_layers} "
                         "layers")
    inputs = SelectorInputs(layout, device, scaling, chunks, attention, softcap)
    return REGISTRY[type(options)](config, inputs)
