"""One decoding step for every request in a KV slab: one attention call per layer, fixed
shapes, replayed from a CUDA graph on a GPU.

Requests decoding together hold slots of one slab (engine/compute/slab.py). The step computes
one token for each of the slab's first ``B`` slots, ``B`` the batch bucket of the highest slot
decoding (1, 2, 4, 8, ...): batch row b is slot b's request, or padding when slot b has none
decoding now (free, or prefilling). Each layer:

- the projections and MLP run once over ``h: [B, hidden]``;
- the new key and value of row b go to ``(dest[b], pos[b])``: its slot at its position, or
  for a padding row the slab's scratch slot, which no request holds;
- attention runs once, ``q: [B, Hkv, g, D]`` over ``k[:B, layer, :, :L]: [B, Hkv, L, D]``
  (each row over its own slot) under an additive mask built on the device (keys <= pos[b],
  and > pos[b] - window), ``L`` the row bucket of the longest request (``buckets.ladder``).

Nothing reads a value back, so on CUDA each (B, L) shape is captured once, at its second
request, and replayed after that (``graphs.capture``, one memory pool for all of them);
elsewhere the same step runs eagerly (the tests compare it with each request decoded alone).

Exactness: a masked key adds exactly zero (every slot row read is finite: slab.py), and a
padding row touches no row of a slot a request holds, so a request's logits are those of its
step alone up to the blocking of the larger matmuls (the tests bound the difference). RoPE
comes from tables of the slot's length, which give a position the same cos/sin only for the
static RoPE kinds (``decode.static_rope``): a runner makes a slab only for those.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from blendrag.engine.compute.batch_decode import batch_logits
from blendrag.engine.compute.buckets import ladder
from blendrag.engine.compute.decode import key_mask
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.graphs import SharedPool
from blendrag.engine.compute.layer import finish, project
from blendrag.engine.compute.layer_feed import pinned, tensor_on
from blendrag.engine.compute.slab import KVSlab
from blendrag.engine.compute.softcap import capped_attention_batched
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables, Rotation

log = logging.getLogger(__name__)

CAPTURE_AT = 2
"""A shape is captured at its second step: a shape seen once (a lone long request) costs no
capture."""


def batch_bucket(n: int, slots: int) -> int:
    """The batch of a step whose highest slot decoding is ``n - 1``: the power of two >= n,
    at most the slab's slots."""
    return min(1 << max(n - 1, 0).bit_length(), slots)


@dataclass
class _Shape:
    """One (batch, rows) shape's inputs and, on CUDA, its graph."""

    inputs: torch.Tensor  # [3, B] long: tokens, positions, destination slots
    keys: torch.Tensor  # [L] key positions
    seen: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None  # the graph's logits [B, vocab]


class SlabStep:
    """Decodes the next token of the requests in ``slab``; ``graphs``: capture each shape as a
    CUDA graph (CUDA only) and replay it."""

    def __init__(self, adapter: LlamaAdapter, slab: KVSlab, graphs: bool) -> None:
        self.adapter, self.slab = adapter, slab
        self.graphs = graphs and slab.k.device.type == "cuda"
        self._rope: RopeTables = adapter.rope(slab.rows, slab.k.dtype, slab.k.device)
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._pool = SharedPool()  # one memory pool for every shape's graph
        self.replays = 0  # steps that were replays (the tests and benchmarks count them)
        # one step at a time: the shapes' inputs (and graphs) are shared by every caller
        self._lock = threading.Lock()

    def decode(self, tokens: Sequence[int], slots: Sequence[int],
               kvs: Sequence[FusedKV]) -> torch.Tensor:
        """Append ``tokens[j]`` at row ``kvs[j].length`` of request KV ``kvs[j]``, the view of
        slot ``slots[j]``, for every j, in one step -> next-token logits [N, vocab] float32."""
        if not (len(tokens) == len(slots) == len(kvs)) or not kvs:
            raise ValueError(f"one token and one slot per request KV, got {len(tokens)} "
                             f"tokens, {len(slots)} slots and {len(kvs)} KVs")
        if len(set(slots)) != len(slots):
            raise ValueError(f"two requests of one step share a slot: {list(slots)}")
        for slot, kv in zip(slots, kvs):
            if not self.slab.holds(kv, slot):
                raise ValueError(f"a request KV is not the view of slot {slot} of this slab")
            if kv.length >= kv.capacity:
                raise ValueError(f"a request KV is full ({kv.capacity} rows)")
        b = batch_bucket(max(slots) + 1, self.slab.slots)
        rows = min(ladder(max(kv.length for kv in kvs) + 1), self.slab.rows)
        host = [[0] * b, [0] * b, [self.slab.scratch] * b]  # padding: token 0 at row 0
        for token, slot, kv in zip(tokens, slots, kvs):
            host[0][slot], host[1][slot], host[2][slot] = token, kv.length, slot
        with self._lock:
            self.slab.zero(list(range(b)))  # padding rows read their slot's first row
            st = self._shape(b, rows)
            # on CUDA pinned and non-blocking (a blocking copy would wait for the stream's
            # queue), straight into the step's input buffer
            inputs = torch.tensor(host)
            if st.inputs.is_cuda:
                st.inputs.copy_(pinned(inputs), non_blocking=True)
            else:
                st.inputs.copy_(inputs)
            st.seen += 1
            out = self._run(st) if self.graphs else self._step(st)
            index = tensor_on(list(slots), out.device)
            logits = out.index_select(0, index).float()  # [N, vocab]: a copy, not the graph's
        for kv in kvs:  # only once the step's logits exist: a failed step wrote no length
            kv.length += 1
        return logits

    @property
    def shapes(self) -> int:
        """Shapes stepped so far (on CUDA, each one's graph once captured)."""
        return len(self._shapes)

    def _shape(self, b: int, rows: int) -> _Shape:
        key = (b, rows)
        if key not in self._shapes:
            dev = self.slab.k.device
            self._shapes[key] = _Shape(torch.zeros(3, b, dtype=torch.long, device=dev),
                                       torch.arange(rows, device=dev))
        return self._shapes[key]

    def _run(self, st: _Shape) -> torch.Tensor:
        if st.graph is None and st.seen >= CAPTURE_AT:
            try:
                st.graph, st.out = self._pool.capture(partial(self._step, st),
                                                      self.slab.k.device)
            except Exception as exc:  # a kernel that cannot be captured: eager, still exact
                log.warning("batched decoding without CUDA graphs (%s: %s)",
                            type(exc).__name__, exc)
                # out of memory: this step only (captured again later); else for good
                self.graphs = isinstance(exc, torch.OutOfMemoryError)
                return self._step(st)
        if st.graph is None or st.out is None:
            return self._step(st)
        st.graph.replay()
        self.replays += 1
        return st.out

    @torch.inference_mode()
    def _step(self, st: _Shape) -> torch.Tensor:
        a, slab = self.adapter, self.slab
        tokens, pos, dest = st.inputs  # [B] each
        b, rows = st.inputs.shape[1], st.keys.shape[0]
        h = a.embed(tokens)  # [B, hidden]
        rotations: dict[int, Rotation] = {}
        masks: dict[int | None, torch.Tensor] = {}
        for i, layer in enumerate(a.layers):
            table = self._rope.layer(i)
            if id(table) not in rotations:  # gathered on the device: no sync
                rotations[id(table)] = table.at(pos)
            q, k, _, v = project(a, layer, h, rotations[id(table)])  # q: [H, B, D]
            k_layer, v_layer = slab.k[:, i], slab.v[:, i]  # [slots + 1, Hkv, rows, D]
            k_layer[dest, :, pos] = k.transpose(0, 1)  # [B, Hkv, D] at (dest[b], pos[b])
            v_layer[dest, :, pos] = v.transpose(0, 1)
            window = a.sliding_window(i)
            if window not in masks:
                masks[window] = self._mask(st, window, q.dtype)
            o = self._attend(q, k_layer[:b, :, :rows], v_layer[:b, :, :rows], masks[window])
            h = finish(a, layer, h, o)
        return batch_logits(a, a.norm(h))  # [B, vocab]

    def _mask(self, st: _Shape, window: int | None, dtype: torch.dtype) -> torch.Tensor:
        softcap = self.adapter.attn_softcap is not None
        # [B, 1, 1, L]: boolean for capped attention's own masking, else an additive bias
        return key_mask(st.keys, st.inputs[1], window, softcap, dtype)[:, None, None]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """q: [H, B, D] over k, v: [B, Hkv, L, D] (row b over its own slot) -> o: [H, B, D].
        The q heads of one KV head attend as that head's rows (no GQA expansion)."""
        a = self.adapter
        heads, b, d = q.shape
        hkv = k.shape[1]
        qb = q.transpose(0, 1).reshape(b, hkv, heads // hkv, d)  # [B, Hkv, g, D]
        if a.attn_softcap is not None:
            o = capped_attention_batched(qb, k, v, mask, a.scaling, a.attn_softcap)
        else:
            o = F.scaled_dot_product_attention(qb, k, v, attn_mask=mask, scale=a.scaling)
        return o.reshape(b, heads, d).transpose(0, 1)  # [H, B, D]
