"""Several requests' passes in one forward: a packed, ragged layer loop.

A cached pass computes few tokens (reuse's question, blend's recomputed tokens, a prefix-cache
tail): on a GPU its layer loop is bound by reading every weight and by launching kernels, not
by its arithmetic, so several requests' passes cost about what one does when they run as one
forward. Their computed tokens form one flat list ``h: [sum A_j, hidden]`` (request j's
``A_j`` tokens together, at their own positions); every projection, RoPE and the MLP run once
over all of them, and only what is a request's own runs per request: its cached rows placed
(its feed), its rows written into its own request KV, a blend selector's choice at a check
layer, and attention over its own request KV with the exact plan its pass alone would use
(engine/compute/loop.py ``ActiveTokens``). No row of one request reaches another's tokens.

Each request keeps its own RoPE tables: its rotation is gathered from them at its positions, as
alone, and the rotations are concatenated, so any RoPE kind packs. A request whose cached rows
fail to load at a layer (its feed raises) leaves the pass there with its error; the others go
on. Exactness: a request's rows run the arithmetic of its pass alone, except that its
projections and MLP are rows of a larger matmul, whose blocking may round differently in the
last bit (the tests bound the logits).

A lane whose observers ask for attention scores (the preview pass) gets them as alone: its
probabilities computed explicitly (engine/compute/layer.py ``attend_scored``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer import attend, attend_scored, finish, project
from blendrag.engine.compute.loop import ActiveTokens, LoopPlan, LoopResult
from blendrag.engine.compute.observers import LayerObserver, LayerStep
from blendrag.engine.selection.selectors import CheckView
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables, Rotation


@dataclass
class Lane:
    """One request's pass inside a packed forward: its ``plan`` over its own request KV
    ``fused`` with its ``rope`` tables, watched by ``observers``. While it runs: ``active``, its
    computed tokens; ``h``: their hidden states [A, hidden]; ``error``: why it left the pass."""

    plan: LoopPlan
    fused: FusedKV
    rope: RopeTables
    observers: tuple[LayerObserver, ...] = ()
    active: ActiveTokens | None = field(default=None, init=False)
    h: torch.Tensor | None = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)
    scored: bool = field(default=False, init=False)  # its observers ask for attention scores

    def __post_init__(self) -> None:
        self.scored = any(o.scores for o in self.observers)


@torch.inference_mode()
def run_packed(adapter: LlamaAdapter, lanes: Sequence[Lane],
               kernel: str = "sdpa") -> list[LoopResult | BaseException]:
    """Every layer of every lane's plan in one forward -> per lane, its ``LoopResult`` (what
    ``loop.run_layers`` gives it alone, within rounding) or the error that stopped it (its
    cached rows failed to load; a step of its own raised). An error in the shared arithmetic
    (the projections, the MLP) is every lane's and is raised."""
    for lane in lanes:
        _start(adapter, lane, kernel)
    check = [_check_layers(lane) for lane in lanes]
    for i, layer in enumerate(adapter.layers):
        live = [j for j, lane in enumerate(lanes) if lane.error is None and _fed(lanes[j], i)]
        if not live:
            break
        rows = [lanes[j] for j in live]
        h = torch.cat([_h(lane) for lane in rows])  # [sum A, hidden]
        q, k, k_pre, v = project(adapter, layer, h, _rotation(rows, i))  # q: [H, sum A, D]
        outs: list[torch.Tensor] = []
        kept: list[Lane] = []
        # each lane's rows, split once per layer (not sliced per lane: a host dispatch each)
        sizes = [_h(lane).shape[0] for lane in rows]
        parts = zip(*(x.split(sizes, dim=1) for x in (q, k, k_pre, v)))
        for j, lane, (q_j, k_j, k_pre_j, v_j) in zip(live, rows, parts):
            try:
                o = _own(adapter, lane, i, check[j], q_j, k_j, k_pre_j, v_j)
            except Exception as exc:  # this request's own step: it leaves, the others go on
                lane.error = exc
                continue
            outs.append(o)
            kept.append(lane)
        if not kept:
            break
        hs = [_h(lane) for lane in kept]
        h = finish(adapter, layer, torch.cat(hs), torch.cat(outs, dim=1))  # [sum A', hidden]
        for lane, part in zip(kept, h.split([x.shape[0] for x in hs])):
            lane.h = part
    out: list[LoopResult | BaseException] = []
    for lane in lanes:
        if lane.error is not None:
            out.append(lane.error)
            continue
        lane.fused.length = lane.plan.ids.shape[0]
        out.append(LoopResult(hidden=adapter.norm(_h(lane)[-1:])[0]))
    return out


def _start(adapter: LlamaAdapter, lane: Lane, kernel: str) -> None:
    """The lane's first layer's tokens and embeddings, as ``loop.run_layers`` starts."""
    plan, fused = lane.plan, lane.fused
    n = plan.ids.shape[0]
    if plan.active.numel() == 0 or int(plan.active[-1]) != n - 1:
        lane.error = ValueError("the last prompt token must be computed (active)")
        return
    lane.active = ActiveTokens(plan.active, n, adapter, kernel, fused.k.dtype, plan.ape)
    if plan.ape is not None:  # what each layer reused, for the decoded tokens
        fused.ape = plan.ape.ape
        fused.ape_stale = torch.zeros(fused.k.shape[0], fused.capacity, dtype=torch.bool,
                                      device=fused.k.device)  # [layers, capacity]
    lane.h = adapter.embed(plan.ids[lane.active.pos])  # h: [A, hidden]


def _check_layers(lane: Lane) -> dict[int, int]:
    selector = lane.plan.selector
    layers = selector.check_layers if selector is not None else ()
    return {layer: step for step, layer in enumerate(layers)}


def _fed(lane: Lane, i: int) -> bool:
    """Wait for the lane's cached rows of layer ``i``; False (its error kept) when they fail."""
    feed = lane.plan.feed
    if feed is None or not feed.segments:
        return True
    try:
        feed.wait(i)
    except Exception as exc:  # a tier error, a checksum: this request's, retried by its caller
        lane.error = exc
        return False
    return True


def _rotation(lanes: Sequence[Lane], i: int) -> Rotation:
    """RoPE of layer ``i`` at every lane's positions, each from its own tables: cos/sin
    [sum A, R]."""
    rots = [_active(lane).rotation(lane.rope.layer(i)) for lane in lanes]
    if len(rots) == 1:
        return rots[0]
    return Rotation(torch.cat([r.cos for r in rots]), torch.cat([r.sin for r in rots]))


def _own(adapter: LlamaAdapter, lane: Lane, i: int, check: dict[int, int], q: torch.Tensor,
         k: torch.Tensor, k_pre: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """What layer ``i`` does for one lane alone, after the shared projections: its rows
    written, a check layer's choice, its attention -> o: [H, A', D]. q: [H, A, D]; k, k_pre, v:
    [Hkv, A, D]."""
    fused, plan, active = lane.fused, lane.plan, _active(lane)
    pos, n = active.pos, plan.ids.shape[0]
    keep = None
    if plan.selector is not None and i in check:
        k_old, v_old = fused.k[i][:, pos], fused.v[i][:, pos]  # the cached rows
        fused.write(i, pos, k, v)
        keep = plan.selector.keep(CheckView(check[i], i, pos, q, k, v, k_old, v_old, fused, n))
    else:
        fused.write(i, pos, k, v)
    if keep is not None:
        active = lane.active = ActiveTokens(pos[keep], n, adapter, active.kernel, fused.k.dtype,
                                            plan.ape)
        lane.h, q = _h(lane)[keep], q[:, keep]
    window = adapter.sliding_window(i)
    attention = active.plan(window)
    per_key = None
    if lane.scored:  # the preview pass: its probabilities too
        o, per_key = attend_scored(adapter, i, q, fused, n, active.bias(window))
    else:
        o = attend(adapter, i, q, fused, attention)  # [H, A', D]
    if fused.ape_stale is not None and active.stale is not None:
        fused.ape_stale[i, :n] = active.stale
    if lane.observers:
        step = LayerStep(i, active.pos, q, pos, k_pre, v, attention.attended_keys, per_key)
        for observer in lane.observers:
            observer.on_layer(step)
    return o


def _active(lane: Lane) -> ActiveTokens:
    if lane.active is None:
        raise RuntimeError("a lane runs before it started")
    return lane.active


def _h(lane: Lane) -> torch.Tensor:
    if lane.h is None:
        raise RuntimeError("a lane runs before it started")
    return lane.h
