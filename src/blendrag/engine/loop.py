"""The layer loop: every mode (full, prefix, reuse, blend), the preview pass and the chunk
computation are this one loop with a different plan.

A plan says which tokens are computed ("active") from layer 0, where the cached rows come from
(a ``LayerFeed``; none when there is nothing to load) and, for blend, the selector that may
shrink the active set at its check layers. Per layer:

  1. load the cached rows of this layer into the request's KV, keys rotated to their positions
     (the feed reads them now, or has read them ahead while earlier layers computed)
  2. project the active tokens: q, k, v (fresh)
  3. at a check layer, score the active chunk tokens against their cached rows and keep the top
  4. write the fresh k, v of every active token into the request's KV
  5. attention of the kept tokens over the request's KV (exact causal mask), o_proj, MLP

With every token active at every layer this is exactly a full prefill; rows that are never
active keep their cached KV. What a caller wants to know of each layer (the rows it computed,
the attention its tokens paid, counts for the stats) it learns through ``LayerObserver``s,
which watch and never steer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from blendrag.engine.fused_kv import FusedKV
from blendrag.engine.layer import (
    AttentionBlock,
    attend,
    attend_scored,
    attention_blocks,
    finish,
    project,
)
from blendrag.engine.layer_feed import LayerFeed
from blendrag.engine.observers import LayerObserver, LayerStep
from blendrag.engine.phases import OFF, PhaseClock
from blendrag.engine.selectors import CheckView, Selector
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables


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


@dataclass
class LoopResult:
    hidden: torch.Tensor  # [hidden] final-normed hidden state of the last position
    load_work_s: float = 0.0  # time spent copying and rotating the cached rows into the buffer


@torch.inference_mode()
def run_layers(adapter: LlamaAdapter, plan: LoopPlan, fused: FusedKV, rope: RopeTables,
               observers: tuple[LayerObserver, ...] = (), clock: PhaseClock = OFF) -> LoopResult:
    """Run every layer of ``plan``, filling ``fused`` rows [0, N); ``observers`` see each layer
    once it is computed, ``clock`` charges each step's time to its phase (engine/phases.py)."""
    n = plan.ids.shape[0]
    pos = plan.active  # [A]
    if pos.numel() == 0 or int(pos[-1]) != n - 1:
        raise ValueError("the last prompt token must be computed (active)")
    h = adapter.embed(plan.ids[pos])  # h: [A, hidden]
    check_layers = plan.selector.check_layers if plan.selector else ()
    check = {layer: step for step, layer in enumerate(check_layers)}
    scored = any(o.scores for o in observers)
    blocks: dict[int | None, list[AttentionBlock]] = {}  # per sliding window, for this `pos`
    attended: dict[int | None, int] = {}
    result = LoopResult(hidden=h[-1])
    feed = plan.feed if plan.feed is not None and plan.feed.segments else None

    masked = adapter.attn_softcap is not None  # capped attention has no mask-free kernel
    for i, layer in enumerate(adapter.layers):
        table = rope.layer(i)
        if feed is not None:
            rows = feed.get(i)
            t0 = time.perf_counter()
            fused.load(i, feed.segments, rows, table, clock)
            result.load_work_s += time.perf_counter() - t0
        q, k, k_pre, v = project(adapter, layer, h, pos, table)  # q: [H, A, D]; k, v: [Hkv, A, D]
        clock.lap("project")
        projected = pos
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
            pos, h, q = pos[keep], h[keep], q[:, keep]
            blocks.clear()
            attended.clear()
        window = adapter.sliding_window(i)
        if window not in blocks:
            blocks[window] = attention_blocks(pos, n, window, masked=masked)
            attended[window] = int((pos + 1).clamp(max=window or n).sum())
        per_key = None
        if scored:
            o, per_key = attend_scored(adapter, i, q, pos, fused, n, window)
        else:
            o = attend(adapter, i, q, fused, blocks[window])  # [H, A, D]
        clock.lap("attention")
        h = finish(adapter, layer, h, o)
        clock.lap("mlp")
        if observers:
            step = LayerStep(i, pos, q, projected, k_pre, v, attended[window], per_key)
            for observer in observers:
                observer.on_layer(step)

    fused.length = n
    result.hidden = adapter.norm(h[-1:])[0]
    return result
