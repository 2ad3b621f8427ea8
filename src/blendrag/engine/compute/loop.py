"""The layer loop: every mode (full, prefix, reuse, blend), the preview pass and the chunk
computation are this one loop with a different plan.

A plan says which tokens are computed ("active") from layer 0, where the cached rows come from
(a ``LayerFeed``; none when there is nothing to load) and, for blend, the selector that may
shrink the active set at its check layers. Per layer:

  1. wait for the cached rows of this layer in the request's KV, keys rotated to their
     positions (the feed places them now, or has placed them ahead while earlier layers
     computed)
  2. project the active tokens: q, k, v (fresh)
  3. at a check layer, score the active chunk tokens against their cached rows and keep the top
  4. write the fresh k, v of every active token into the request's KV
  5. attention of the kept tokens over the request's KV (exact causal mask; planned once per
     set of tokens, engine/compute/attention.py), o_proj, MLP

With every token active at every layer this is exactly a full prefill; rows that are never
active keep their cached KV. What a caller wants to know of each layer (the rows it computed,
the attention its tokens paid, counts for the stats) it learns through ``LayerObserver``s,
which watch and never steer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blendrag.engine.compute.attention import AttentionPlan, plan_attention, score_bias
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer import attend, attend_scored, finish, project
from blendrag.engine.compute.layer_feed import LayerFeed
from blendrag.engine.compute.observers import OFF, LayerObserver, LayerStep, PhaseClock
from blendrag.engine.selection.ape import ApePlan, ApeSpan
from blendrag.engine.selection.selectors import CheckView, Selector
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTable, RopeTables, Rotation


@dataclass
class LoopPlan:
    """ids: [N] the request's tokens; active: [A] positions computed from layer 0 (sorted, ends
    with the last position); feed: the cached rows, layer by layer (None: nothing to load, the
    buffer holds every row the plan does not compute); selector: blend's choice at check
    layers."""

    ids: torch.Tensor
    active: torch.Tensor
    feed: LayerFeed | None = None
    selector: Selector | None = None
    ape: ApeSpan | None = None  # the suffix reads reused rows with APE (engine/selection/ape.py)


@dataclass
class LoopResult:
    """hidden: [hidden] the last position's final-normed hidden state. warming: the pass ran
    as its shape will not from now on (a captured pass's shape seen the first time ran the layer
    loop, or was captured now: engine/compute/static_pass.py), so its time is no steady-state
    figure to learn from."""

    hidden: torch.Tensor
    warming: bool = False


class ActiveTokens:
    """The tokens a layer computes, at positions ``pos`` [A] (sorted), and what every layer that
    computes them shares, made at its first use: the RoPE rotation at those positions per
    table, the attention plan per sliding window, the preview pass's score bias. They change
    only at a selector's check layers."""

    def __init__(self, pos: torch.Tensor, n: int, adapter: LlamaAdapter, kernel: str,
                 dtype: torch.dtype, ape: ApeSpan | None = None) -> None:
        self.pos, self.n, self.adapter, self.kernel, self.dtype = pos, n, adapter, kernel, dtype
        self.ape = ape
        self.stale = None if ape is None else ape.stale(pos, n)  # [n]: the rows APE reads
        self._rotations: dict[int, Rotation] = {}
        self._plans: dict[int | None, AttentionPlan] = {}
        self._bias: dict[int | None, torch.Tensor] = {}

    def rotation(self, table: RopeTable) -> Rotation:
        key = id(table)  # the request's tables live as long as the loop
        if key not in self._rotations:
            self._rotations[key] = table.at(self.pos)
        return self._rotations[key]

    def plan(self, window: int | None) -> AttentionPlan:
        if window not in self._plans:
            if self.ape is not None and self.stale is not None:  # stale is set with ape
                self._plans[window] = ApePlan(self.pos, self.n, window, self.kernel, self.dtype,
                                              self.ape, self.stale)
            else:
                self._plans[window] = plan_attention(self.pos, self.n, window, self.kernel,
                                                     self.dtype, self.adapter.attn_softcap)
        return self._plans[window]

    def bias(self, window: int | None) -> torch.Tensor:
        if window not in self._bias:
            groups = self.adapter.num_heads // self.adapter.num_kv_heads
            self._bias[window] = score_bias(self.pos, self.n, window, groups)
        return self._bias[window]


@torch.inference_mode()
def run_layers(adapter: LlamaAdapter, plan: LoopPlan, fused: FusedKV, rope: RopeTables,
               observers: tuple[LayerObserver, ...] = (), clock: PhaseClock = OFF,
               kernel: str = "sdpa") -> LoopResult:
    """Run every layer of ``plan``, filling ``fused`` rows [0, N); ``observers`` see each layer
    once it is computed, ``clock`` charges each step's time to its phase (``PhaseClock``);
    ``kernel``: the attention kernel (engine/compute/attention.py)."""
    n = plan.ids.shape[0]
    if plan.active.numel() == 0 or int(plan.active[-1]) != n - 1:
        raise ValueError("the last prompt token must be computed (active)")
    active = ActiveTokens(plan.active, n, adapter, kernel, fused.k.dtype, plan.ape)
    if plan.ape is not None:  # what each layer reused, for the decoded tokens
        fused.ape = plan.ape.ape
        fused.ape_stale = torch.zeros(fused.k.shape[0], fused.capacity, dtype=torch.bool,
                                      device=fused.k.device)  # [layers, capacity]
    h = adapter.embed(plan.ids[active.pos])  # h: [A, hidden]
    check_layers = plan.selector.check_layers if plan.selector else ()
    check = {layer: step for step, layer in enumerate(check_layers)}
    scored = any(o.scores for o in observers)
    feed = plan.feed if plan.feed is not None and plan.feed.segments else None

    for i, layer in enumerate(adapter.layers):
        if feed is not None:
            feed.wait(i, clock)  # the cached rows of layer i are in ``fused``
        pos = active.pos
        q, k, k_pre, v = project(adapter, layer, h, active.rotation(rope.layer(i)))
        clock.lap("project")  # q: [H, A, D]; k, v: [Hkv, A, D]
        keep = None
        if plan.selector is not None and i in check:
            k_old, v_old = fused.k[i][:, pos], fused.v[i][:, pos]  # the cached rows
            fused.write(i, pos, k, v)
            keep = plan.selector.keep(CheckView(check[i], i, pos, q, k, v, k_old, v_old, fused, n))
            clock.lap("select")
        else:
            fused.write(i, pos, k, v)
            clock.lap("write")
        if keep is not None:
            active = ActiveTokens(pos[keep], n, adapter, kernel, fused.k.dtype, plan.ape)
            h, q = h[keep], q[:, keep]
        window = adapter.sliding_window(i)
        attention = active.plan(window)
        per_key = None
        if scored:
            o, per_key = attend_scored(adapter, i, q, fused, n, active.bias(window))
        else:
            o = attend(adapter, i, q, fused, attention)  # [H, A, D]
        clock.lap("attention")
        if fused.ape_stale is not None and active.stale is not None:
            fused.ape_stale[i, :n] = active.stale
        h = finish(adapter, layer, h, o)
        clock.lap("mlp")
        if observers:
            step = LayerStep(i, active.pos, q, pos, k_pre, v, attention.attended_keys, per_key)
            for observer in observers:
                observer.on_layer(step)

    fused.length = n
    return LoopResult(hidden=adapter.norm(h[-1:])[0])
