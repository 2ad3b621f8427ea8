"""One decoding step for several requests at once: continuous batching's step.

A decoded token of a small model costs little arithmetic: its step is bound by reading every
weight (a GPU) or by the per-layer work around the matmuls (a CPU). Several requests' next
tokens share that cost when they run as one forward: the tokens form one flat list
``h: [N, hidden]`` (request j's token at its own position ``p_j``), every projection and MLP
runs once over the N rows, and only attention is per request: token j attends over its own
request KV's rows [0, p_j] with the exact plan its eager step would use (engine/compute/layer.py
``attend``), so no row of one request reaches another's token.

Exactness: a request's row runs the same arithmetic as its step alone except that its
projections are rows of a larger matmul, whose blocking may round differently in the last bit
(the tests bound the logits' difference). RoPE is gathered at the N positions from the model's
rotary embedding in one call; that gives each position the cos/sin of a table of any length
only for the static RoPE kinds (``decode.static_rope``): any other model (dynamic NTK, longrope)
and a request with APE's scaled attention decode one at a time (``runner.decode``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blendrag.engine.compute.attention import AttentionPlan, LastPlan
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.layer import attend, finish, project
from blendrag.engine.compute.loop import ActiveTokens
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import Rotation


def batchable(fused: FusedKV, static: bool) -> bool:
    """Whether a request decoding into ``fused`` may join a batched step (``static``: the
    model's RoPE is of a static kind)."""
    return static and fused.ape is None


def rotations(adapter: LlamaAdapter, pos: torch.Tensor, dtype: torch.dtype) -> list[Rotation]:
    """Per layer, RoPE at positions ``pos`` [N] from the layer's rotary embedding (one call per
    kind of layer, shared by the layers of that kind)."""
    probe = torch.empty(0, dtype=dtype, device=pos.device)
    by_kind: dict[str, Rotation] = {}
    out = []
    for i in range(adapter.num_layers):
        kind = adapter.rope_kind(i)
        if kind not in by_kind:
            cos, sin = adapter.rotary_for(kind)(probe, pos[None])  # [1, N, R] each
            by_kind[kind] = Rotation(cos[0], sin[0])
        out.append(by_kind[kind])
    return out


@torch.inference_mode()
def decode_batch(adapter: LlamaAdapter, kernel: str, tokens: Sequence[int],
                 kvs: Sequence[FusedKV]) -> torch.Tensor:
    """Append ``tokens[j]`` at row ``kvs[j].length`` of request KV ``kvs[j]``, for every j, in
    one forward -> next-token logits [N, vocab] float32 (row j: request j's)."""
    if len(tokens) != len(kvs) or not kvs:
        raise ValueError(f"one token per request KV, got {len(tokens)} tokens and {len(kvs)} KVs")
    for kv in kvs:
        if kv.length >= kv.capacity:
            raise ValueError(f"a request KV is full ({kv.capacity} rows)")
    if len({id(kv.k) for kv in kvs}) != len(kvs):
        raise ValueError("two requests of one batched step share a request KV")
    device, dtype = kvs[0].k.device, kvs[0].k.dtype
    lengths = [kv.length for kv in kvs]
    pos = torch.tensor(lengths, device=device)  # [N]
    h = adapter.embed(torch.tensor(list(tokens), device=device))  # [N, hidden]
    # each token's own attention plan over keys [0, p_j], made once per window
    plans = [_Plans(adapter, kernel, pos[j:j + 1], p + 1, dtype) for j, p in enumerate(lengths)]
    rope = rotations(adapter, pos, dtype)
    for i, layer in enumerate(adapter.layers):
        q, k, _, v = project(adapter, layer, h, rope[i])  # q: [H, N, D]; k, v: [Hkv, N, D]
        window = adapter.sliding_window(i)
        outs = []
        for j, kv in enumerate(kvs):
            kv.write(i, pos[j:j + 1], k[:, j:j + 1], v[:, j:j + 1])
            outs.append(attend(adapter, i, q[:, j:j + 1], kv, plans[j].get(window)))
        h = finish(adapter, layer, h, torch.cat(outs, dim=1))  # o: [H, N, D] -> h: [N, hidden]
    for kv, p in zip(kvs, lengths):
        kv.length = p + 1
    return batch_logits(adapter, adapter.norm(h)).float()  # [N, vocab]


class _Plans:
    """One decoded token's attention plans, per sliding window. A token that sees every key
    before it (no window, or a window longer than its keys; no soft cap) takes the plan without
    a mask, made here from its length on the host: ``plan_attention`` would read its position
    back from the device, one sync per request and step on a GPU."""

    def __init__(self, adapter: LlamaAdapter, kernel: str, pos: torch.Tensor, n: int,
                 dtype: torch.dtype) -> None:
        self.n, self.softcap = n, adapter.attn_softcap
        self.active = ActiveTokens(pos, n, adapter, kernel, dtype)  # its eager step's plans
        self.last = LastPlan(n)

    def get(self, window: int | None) -> AttentionPlan:
        if self.softcap is None and (window is None or window >= self.n):
            return self.last
        return self.active.plan(window)


def batch_logits(adapter: LlamaAdapter, h: torch.Tensor) -> torch.Tensor:
    """h: [N, hidden] (final-normed) -> logits [N, vocab]. On a CPU a plain output projection is
    taken weight-major (``W @ h^T``): for a few rows that is the matrix-vector path, where
    ``linear`` packs the whole vocabulary's weights for a matrix product (SmolLM2's 49,152 x 576
    head: 4.6 ms against 17 ms for two rows, 5.3 against 13 ms for four)."""
    head = adapter.lm_head
    plain = (type(adapter).logits is LlamaAdapter.logits and isinstance(head, torch.nn.Linear)
             and head.bias is None)
    if plain and h.device.type == "cpu":
        return (head.weight @ h.T).T
    return adapter.logits(h)
