"""The prefill loop: every mode (full, prefix, reuse, blend) and the chunk precompute are this
one loop with a different plan.

A plan says which rows come from the cache and which tokens are computed ("active") from
layer 0; a blend selector may shrink the active set at its check layers. Per layer:

  1. load the cached rows of this layer into the fused KV, keys rotated to their positions
     (the rows come from a ``LayerFeed``: read now, or read ahead while earlier layers compute)
  2. project the active tokens: q, k, v (fresh)
  3. at a check layer, score the active chunk tokens against their cached rows and keep the top
  4. write the fresh k, v of every active token into the fused KV
  5. attention of the kept tokens over the fused KV (exact causal mask), o_proj, MLP

With every token active at every layer this is exactly a full prefill; rows that are never
active keep their cached KV.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from blendrag.engine.fused_kv import CachedSegment, FusedKV
from blendrag.engine.layer import (
    AttentionBlock,
    attend,
    attend_scored,
    attention_blocks,
    finish,
    project,
)
from blendrag.engine.layer_feed import LayerFeed
from blendrag.engine.phases import OFF, PhaseClock
from blendrag.engine.selectors import CheckView, Selector
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTable


@dataclass
class LoopPlan:
    """ids: [N] the request's tokens; cached: rows taken from the cache; active: positions
    computed from layer 0 (sorted; must end with the last position)."""

    ids: torch.Tensor
    cached: list[CachedSegment]
    active: torch.Tensor
    selector: Selector | None = None
    capture: bool = False  # keep the pre-RoPE k and v of the active rows (chunk precompute)
    chunk_range: tuple[int, int] = (0, 0)  # [start, end) of the chunk tokens, for the stats
    # record, per layer, the attention the active tokens pay keys [start, end) (preview pass)
    score_range: tuple[int, int] | None = None
    # the cached rows are in the buffer already: a preview pass over the same buffer loaded
    # them and wrote only rows this plan computes again at every layer (the suffix)
    preloaded: bool = False
    # where the cached rows come from, layer by layer (pipelined or not); None: read in the
    # loop (a sequential feed over ``cached``)
    feed: LayerFeed | None = None


@dataclass
class LoopOutput:
    hidden: torch.Tensor  # [hidden] final-normed hidden state of the last position
    active_per_layer: list[int] = field(default_factory=list)
    # active tokens inside chunk_range
    chunk_active_per_layer: list[int] = field(default_factory=list)
    # keys the active tokens attended to (causal, windowed): attention work per layer
    attended_keys_per_layer: list[int] = field(default_factory=list)
    keys: torch.Tensor | None = None  # [layers, Hkv, A, D] pre-RoPE (capture only)
    values: torch.Tensor | None = None  # [layers, Hkv, A, D]
    attention: torch.Tensor | None = None  # [layers, end - start] float32 (score_range only)
    trace: list[dict] | None = None
    load_work_s: float = 0.0  # the loop's time copying and rotating cached rows it was given


@torch.inference_mode()
def run_loop(adapter: LlamaAdapter, plan: LoopPlan, fused: FusedKV, rope: RopeTable,
             trace: bool = False, clock: PhaseClock = OFF) -> LoopOutput:
    """Run every layer of ``plan``: fill ``fused`` rows [0, N), return the last hidden state.
    ``clock``: charges each step's time to its phase (engine/phases.py)."""
    n = plan.ids.shape[0]
    pos = plan.active  # [A]
    if pos.numel() == 0 or int(pos[-1]) != n - 1:
        raise ValueError("the last prompt token must be computed (active)")
    h = adapter.embed(plan.ids[pos])  # h: [A, hidden]
    check_layers = plan.selector.check_layers if plan.selector else ()
    check = {layer: step for step, layer in enumerate(check_layers)}
    # per sliding window, for the current active set
    blocks: dict[int | None, list[AttentionBlock]] = {}
    attended: dict[int | None, int] = {}
    out = LoopOutput(hidden=h[-1], trace=[] if trace else None)
    keys, values, scores = [], [], []
    lo, hi = plan.chunk_range
    in_chunks = int(((pos >= lo) & (pos < hi)).sum())

    feed = None
    if plan.cached and not plan.preloaded:
        feed = plan.feed or LayerFeed(plan.cached, len(adapter.layers), fused.k.device)

    for i, layer in enumerate(adapter.layers):
        if feed is not None:
            rows = feed.get(i)
            t0 = time.perf_counter()
            fused.load(i, plan.cached, rows, rope, clock)
            out.load_work_s += time.perf_counter() - t0
        q, k, k_pre, v = project(adapter, layer, h, pos, rope)  # q: [H, A, D]; k, v: [Hkv, A, D]
        clock.lap("project")
        keep = None
        if i in check:
            # cached rows of the active tokens
            k_old, v_old = fused.k[i][:, pos], fused.v[i][:, pos]
            fused.write(i, pos, k, v)
            keep = plan.selector.keep(CheckView(check[i], i, pos, q, k, v, k_old, v_old, fused, n))
            clock.lap("select")
        else:
            fused.write(i, pos, k, v)
            clock.lap("write")
        if plan.capture:
            keys.append(k_pre)
            values.append(v)
        if keep is not None:
            pos, h, q = pos[keep], h[keep], q[:, keep]
            blocks.clear()
            attended.clear()
            in_chunks = int(((pos >= lo) & (pos < hi)).sum())
        window = adapter.sliding_window(i)
        if window not in blocks:
            blocks[window] = attention_blocks(pos, n, window)
            attended[window] = int((pos + 1).clamp(max=window or n).sum())
        if out.trace is not None:
            out.trace.append({"layer": i, "pos": pos.clone(), "q": q.clone()})
        if plan.score_range is None:
            o = attend(adapter, i, q, fused, blocks[window])  # [H, A, D]
        else:
            o, per_key = attend_scored(adapter, i, q, pos, fused, n, window)
            scores.append(per_key[plan.score_range[0]:plan.score_range[1]])
        clock.lap("attention")
        h = finish(layer, h, o)
        clock.lap("mlp")
        out.active_per_layer.append(int(pos.shape[0]))
        out.chunk_active_per_layer.append(in_chunks)
        out.attended_keys_per_layer.append(attended[window])

    fused.length = n
    out.hidden = adapter.norm(h[-1:])[0]
    if plan.capture:
        out.keys, out.values = torch.stack(keys), torch.stack(values)
    if scores:
        out.attention = torch.stack(scores)
    return out


@torch.inference_mode()
def decode_step(adapter: LlamaAdapter, token: int, fused: FusedKV) -> torch.Tensor:
    """Append one token at position ``fused.length`` and return its final hidden state [hidden].

    cos/sin are taken from ``rotary_emb`` at this one position, as HF's generate does (it
    matters for dynamic NTK, whose frequencies depend on the current length)."""
    p = fused.length
    if p >= fused.capacity:
        raise ValueError(f"the KV buffer is full ({fused.capacity} rows)")
    rope = RopeTable(adapter.rotary, p + 1, fused.k.dtype, fused.k.device, start=p)
    pos = torch.tensor([p], device=fused.k.device)
    h = adapter.embed(pos.new_tensor([token]))  # [1, hidden]
    for i, layer in enumerate(adapter.layers):
        q, k, _, v = project(adapter, layer, h, pos, rope)
        fused.write(i, pos, k, v)
        o = attend(adapter, i, q, fused, attention_blocks(pos, p + 1, adapter.sliding_window(i)))
        h = finish(layer, h, o)
    fused.length = p + 1
    return adapter.norm(h)[0]
