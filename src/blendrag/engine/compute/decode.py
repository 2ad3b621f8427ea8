"""Decoding one token as a step of fixed shape, replayed from a CUDA graph on a GPU.

A decoded token at position p runs every layer for one query. Eagerly (``ModelRunner.decode``)
its shapes grow with p (the keys [0, p]) and every kernel is launched from Python: on a GPU a
7B model's step is then bound by the launches (about 30 per layer), not by reading the weights.
``StaticDecoder`` gives the step fixed shapes instead (gpt-fast's way): the token and its
position are device tensors, cos/sin are gathered on the device from a table of the buffer's
whole length, the new rows are written at the position, and attention runs over the request
KV's whole buffer under an additive mask computed on the device (keys <= p, and > p - window).
Nothing in the step reads a value back, so on CUDA it is captured once per buffer as a CUDA
graph and each token is one replay; elsewhere the same step runs eagerly (the tests compare it
with the eager decode on the CPU).

Exactness: a masked key adds exactly zero to the softmax (the buffer's rows past the current
length hold zeros or rows an earlier request computed, never a NaN: engine/compute/fused_kv.py), so
the
step computes what the eager decode computes. cos/sin of one position do
not depend on the table's length for the static RoPE kinds (default, linear, llama3, yarn): a
model whose frequencies change with the length (dynamic NTK, longrope) decodes eagerly.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.graphs import capture
from blendrag.engine.compute.layer import finish, project
from blendrag.engine.compute.softcap import capped_attention
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables, Rotation

log = logging.getLogger(__name__)

STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})


def key_mask(keys: torch.Tensor, pos: torch.Tensor, window: int | None, softcap: bool,
             dtype: torch.dtype) -> torch.Tensor:
    """Which of the keys at positions ``keys`` [L] decoded tokens at ``pos`` [B] see (keys
    <= pos, and > pos - window), built on the device -> [B, L]: boolean for soft-capped
    attention (``softcap``), else an additive bias in ``dtype`` (0 or -inf)."""
    visible = keys[None] <= pos[:, None]  # [B, L]
    if window is not None:
        visible &= keys[None] > pos[:, None] - window
    if softcap:
        return visible
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return bias.masked_fill_(~visible, float("-inf"))


def static_rope(adapter: LlamaAdapter) -> bool:
    """Whether every RoPE table of ``adapter`` gives a position the same cos/sin whatever the
    table's length (what a table of the buffer's length needs)."""
    kinds = {adapter.rope_kind(i) for i in range(adapter.num_layers)}
    return all(getattr(adapter.rotary_for(k), "rope_type", "default") in STATIC_ROPE
               for k in kinds)


@dataclass
class _Step:
    """One buffer's step: its inputs, tables and (on CUDA) captured graph. It does not hold the
    buffer (a request's rows stay its own, freed with it): each call gets the buffer, and a
    graph is replayed only over a buffer of the same addresses, shape and layout, as captured."""

    rope: RopeTables  # positions [0, capacity)
    token: torch.Tensor  # [1] long
    pos: torch.Tensor  # [1] long
    keys: torch.Tensor  # [capacity] key positions
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None  # the graph's logits


class StaticDecoder:
    """Decodes tokens with fixed shapes over each request KV's whole buffer; ``graphs``: capture
    the step as a CUDA graph (CUDA only) and replay it."""

    KEPT = 2  # steps (and graphs) kept: the pooled buffer's, and one more (never the buffer)

    def __init__(self, adapter: LlamaAdapter, graphs: bool) -> None:
        self.adapter = adapter
        self.graphs = graphs
        self._steps: OrderedDict[tuple, _Step] = OrderedDict()
        # requests decoding on several threads (users' generate, the scheduler's loop) meet here
        self._lock = threading.Lock()

    def decode(self, token: int, fused: FusedKV) -> torch.Tensor:
        """Append ``token`` at ``fused.length``; its next-token logits [vocab] float32."""
        p = fused.length
        if p >= fused.capacity:
            raise ValueError(f"the KV buffer is full ({fused.capacity} rows)")
        k, v = fused.base  # [layers, Hkv, capacity, D]: the buffer's whole storage
        st = self._state(k, v)
        st.token.fill_(token)
        st.pos.fill_(p)
        if self.graphs and k.device.type == "cuda":
            logits = self._replay(st, k, v)
        else:
            logits = self._step(st, k, v)
        fused.length = p + 1
        return logits.clone()

    @property
    def buffers(self) -> int:
        """Buffers whose step (on CUDA: captured graph) is kept."""
        return len(self._steps)

    def clear(self) -> None:
        """Drop every step (and its graph and buffer reference)."""
        with self._lock:
            self._steps.clear()

    def _state(self, k: torch.Tensor, v: torch.Tensor) -> _Step:
        with self._lock:
            return self._kept(k, v)

    def _kept(self, k: torch.Tensor, v: torch.Tensor) -> _Step:
        """The step over the buffer ``k``, ``v``, made at its first use (the caller holds the
        lock); keyed by what a captured graph reads: the addresses, shape, layout and dtype."""
        key = (k.data_ptr(), v.data_ptr(), tuple(k.shape), k.stride(), v.stride(), k.dtype)
        if key not in self._steps:
            cap, dev = k.shape[2], k.device
            self._steps[key] = _Step(
                self.adapter.rope(cap, k.dtype, dev),
                torch.zeros(1, dtype=torch.long, device=dev),
                torch.zeros(1, dtype=torch.long, device=dev), torch.arange(cap, device=dev))
            while len(self._steps) > self.KEPT:
                self._steps.popitem(last=False)
        self._steps.move_to_end(key)
        return self._steps[key]

    @torch.inference_mode()
    def _step(self, st: _Step, kk: torch.Tensor, vv: torch.Tensor) -> torch.Tensor:
        """The step over the buffer ``kk``, ``vv`` ([layers, Hkv, capacity, D])."""
        a, pos = self.adapter, st.pos
        h = a.embed(st.token)  # [1, hidden]
        rotations: dict[int, Rotation] = {}
        masks: dict[int | None, torch.Tensor] = {}
        for i, layer in enumerate(a.layers):
            table = st.rope.layer(i)
            if id(table) not in rotations:  # gathered on the device: no sync
                rotations[id(table)] = table.at(pos)
            q, k, _, v = project(a, layer, h, rotations[id(table)])  # q: [H, 1, D]
            kk[i].index_copy_(1, pos, k)
            vv[i].index_copy_(1, pos, v)
            window = a.sliding_window(i)
            if window not in masks:
                masks[window] = self._mask(st, window, q.dtype)
            h = finish(a, layer, h, self._attend(q, kk[i], vv[i], masks[window]))
        return a.logits(a.norm(h))[0].float()

    def _mask(self, st: _Step, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        softcap = self.adapter.attn_softcap is not None
        mask = key_mask(st.keys, st.pos, window, softcap, dtype)  # [1, capacity]
        # boolean [1, capacity] for capped attention's own masking; else [1, 1, capacity]
        return mask if softcap else mask[None]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """q: [H, 1, D] over k, v: [Hkv, capacity, D] -> o: [H, 1, D]. The q heads of one KV
        head are that head's rows (no GQA expansion of the whole KV)."""
        a = self.adapter
        heads, _, d = q.shape
        hkv = k.shape[0]
        if a.attn_softcap is not None:
            return capped_attention(q, k, v, mask, a.scaling, a.attn_softcap)
        q = q.view(hkv, heads // hkv, d)  # [Hkv, g, D]
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                           scale=a.scaling)  # [1, Hkv, g, D]
        # CUDA's flash kernel returns [1, g, Hkv, D] memory order behind this shape: reshape
        return o[0].reshape(heads, 1, d)

    def _replay(self, st: _Step, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if st.graph is None or st.out is None:
            try:
                st.graph, st.out = self._capture(st, k, v)
            except Exception as exc:  # a kernel that cannot be captured: eager, still exact
                log.warning("decoding without a CUDA graph (%s: %s)", type(exc).__name__, exc)
                # out of memory: this step only (captured again later); else for good
                self.graphs = isinstance(exc, torch.OutOfMemoryError)
                return self._step(st, k, v)
        st.graph.replay()
        return st.out

    def _capture(self, st: _Step, k: torch.Tensor,
                 v: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``st``'s step over ``k``, ``v`` captured, and its logits tensor, which every replay
        refills."""
        return capture(partial(self._step, st, k, v), k.device)
