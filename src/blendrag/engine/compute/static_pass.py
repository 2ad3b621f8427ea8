"""Cached passes of fixed shape, replayed from a CUDA graph per bucket.

A cached request at a typical prompt computes few tokens over thousands of cached rows: reuse
the question's few dozen, blend@15 % a few hundred, a prefix-cache tail what follows the
cached prefix. The layer loop (engine/compute/loop.py) launches every kernel of such a pass
from Python, and on a GPU a 7B model's pass is then bound by its launches, not by its
arithmetic (reuse at 3k tokens: 2,235 kernels for 64 computed tokens).

``StaticPasses`` runs the same pass with fixed shapes, as the decoding step does
(engine/compute/decode.py) and as vLLM and SGLang capture their prefill and extend passes:

- the computed tokens are padded to a *token bucket* (``TOKEN_BUCKETS``) and the keys to a
  *row bucket* (``row_bucket``: at most a quarter more rows than the prompt, past it one row
  at least): one shape per pair of buckets, whatever the request;
- the token ids, their positions and the index of the last one are device tensors filled
  before each pass; RoPE is gathered at the positions on the device from a table of the row
  bucket's length; every layer's mask is built on the device from the positions (keys <= p,
  and > p - window); the selection is made before the pass (a selector without check layers:
  preview, epic, ...), so nothing in the pass reads a value back;
- on CUDA each (buffer, token bucket, row bucket) is captured as a CUDA graph the second time
  it is asked for (a shape seen once is not worth a capture; ``engine.warmup()`` asks twice)
  and every later pass of that shape is one replay; elsewhere the same pass runs eagerly (the
  tests compare it with the layer loop on the CPU).

Exactness: a padded token sits at the row bucket's last position, past every real one, and
its keys and values are written to the request KV's last row, past the whole prompt (a
bridge's pass ends inside it), where no real token looks: a real token at p sees keys <= p.
A padded token's own attention, MLP and hidden state are computed and dropped; they are finite
(its id is 0, a real token), so no NaN reaches a masked key. The rows past the prompt are the
request's own (``FusedKV``'s capacity), zeroed before its first pass if an earlier request
wrote there (``FusedKV.drop_earlier_rows``); the decoding step masks them. A real
token runs the arithmetic of the layer loop, with its projections as rows of a larger matmul
(the tests bound the logits' difference).

With ``ComputeConfig(pass_attention="explicit")`` a pass of at most ``EXPLICIT_TOKENS`` tokens
computes its attention as the preview pass does: the probabilities in float32 with the exact
mask added in the matmul (a padded token seeing only its own row), then one batched GEMM with
the values. For a few queries over thousands of keys the GEMMs spread the keys over the whole
device, where a FlexAttention tile of queries walks them alone; a larger pass keeps the kernel
(its probabilities, [heads, tokens, rows] in float32, would be gigabytes, and a captured graph
keeps its buffers).

What takes the layer loop instead: a pass that computes half the prompt or more (a full
prefill, prefix mode's long tail: their kernels are the causal ones), a request KV that is not
the runner's pooled buffer (a graph is bound to its buffer's memory: requests served side by
side each hold one of their own), a selector that checks at layers (CacheBlend's), APE, a
timed request (``PhaseClock``), an observer other than the counts and the preview pass's
attention per key (which the pass computes explicitly, as the loop does, a padded token
seeing only its own row), cached rows still to be read
from a host tier (the pipelined feed overlaps their reads with the loop) or read into pageable
host memory (the host's staging copy is the bound: the pipelined feed overlaps it with the
loop; rows in page-locked memory, the RAM tier's on a GPU, are sent by DMA before the replay),
more tokens than the
largest bucket, a prompt that leaves no row past it, a model whose RoPE changes with the length.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from blendrag.engine.compute.attention import FlexPlan, score_bias
from blendrag.engine.compute.buckets import row_bucket, token_bucket
from blendrag.engine.compute.flex import flex_kernel
from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.graphs import SharedPool
from blendrag.engine.compute.layer import attend_scored, finish, project
from blendrag.engine.compute.loop import LoopPlan, LoopResult
from blendrag.engine.compute.observers import KeyAttention, LayerCounts, LayerObserver
from blendrag.engine.compute.softcap import capped_attention
from blendrag.model.adapters import LlamaAdapter
from blendrag.model.rope import RopeTables, Rotation

log = logging.getLogger(__name__)

_WATCHERS = (LayerCounts, KeyAttention)  # observers a static pass serves (and the preview's)

CAPTURE_AT = 2  # a shape is captured the second time a pass asks for it
EXPLICIT_TOKENS = 128  # the largest token bucket whose attention ``explicit`` computes so
_Shape = tuple[int, int, bool]


@dataclass
class _Pass:
    """One shape's inputs and tables over one buffer, and on CUDA its graph."""

    k: torch.Tensor  # [layers, Hkv, capacity, D]: the buffer's whole storage
    v: torch.Tensor
    rows: int  # the row bucket: keys [0, rows) attended
    rope: RopeTables  # positions [0, rows)
    ids: torch.Tensor  # [tokens] long: the token bucket's ids (padding: 0)
    pos: torch.Tensor  # [tokens] long: their positions (padding: rows - 1)
    at: torch.Tensor  # [tokens] long: the rows they are written to (padding: the KV's last)
    last: torch.Tensor  # [1] long: the index of the last real token
    scored: torch.Tensor | None = None  # [layers, rows] float32: attention paid each key
    seen: int = 0
    retry_at: int = CAPTURE_AT  # the shape's pass captured once it is seen this often
    backoff: int = 1  # passes of the shape waited after the last capture out of memory
    graph: torch.cuda.CUDAGraph | None = None
    out: torch.Tensor | None = None  # the graph's hidden state


class StaticPasses:
    """Cached passes of fixed shape over each request KV's buffer (module docstring);
    ``graphs``: capture them as CUDA graphs (CUDA only) and replay them; ``kernel``: the
    engine's attention kernel (``flex``: FlexAttention's block mask, built in the pass);
    ``explicit``: every pass's attention computed as the preview pass's is (probabilities in
    float32, then a GEMM with the values) instead of by the kernel
    (``ComputeConfig.pass_attention``)."""

    KEPT_BUFFERS = 1  # buffers whose passes are kept: the pooled one (the runner's choice)
    KEPT_SHAPES = 64  # shapes kept (the graphs share one memory pool)

    def __init__(self, adapter: LlamaAdapter, kernel: str, graphs: bool,
                 explicit: bool = False) -> None:
        self.adapter, self.kernel, self.graphs, self.explicit = adapter, kernel, graphs, explicit
        self.failed = False  # a capture failed: passes run the layer loop from then on
        self._lock = threading.Lock()  # requests on several threads (serving's prefill worker)
        # per buffer, per shape (tokens, rows, scored)
        self._by_buffer: OrderedDict[tuple, OrderedDict[_Shape, _Pass]] = OrderedDict()
        self._pool = SharedPool()  # one memory pool for the captured passes alive
        self.ran = self.replays = self.captures = 0  # passes run, of them replayed; graphs
        self._windows = [adapter.sliding_window(i) for i in range(adapter.num_layers)]

    def takes(self, plan: LoopPlan, fused: FusedKV,
              observers: Sequence[LayerObserver]) -> bool:
        """Whether ``plan`` runs as a static pass (module docstring: what does not)."""
        selector, a, n = plan.selector, plan.active.shape[0], plan.ids.shape[0]
        return (not self.failed and 2 * a < n and plan.ape is None
                and (selector is None or not selector.check_layers)
                and all(type(o) in _WATCHERS for o in observers)
                and (plan.feed is None or plan.feed.loaded)
                and token_bucket(a) is not None and row_bucket(n, fused.capacity) is not None)

    @torch.inference_mode()  # its inputs, made at a shape's first pass, whatever the caller
    def run(self, plan: LoopPlan, fused: FusedKV,
            observers: Sequence[LayerObserver] = ()) -> LoopResult | None:
        """Every layer of ``plan`` (``takes`` it) filling ``fused`` rows [0, N); None when the
        layer loop should run it instead (on CUDA: a shape not yet worth a capture)."""
        n, a = plan.ids.shape[0], plan.active.shape[0]
        tokens, rows = token_bucket(a), row_bucket(n, fused.capacity)
        if tokens is None or rows is None:
            raise ValueError(f"no static pass computes {a} tokens of {n} in "
                             f"{fused.capacity} rows")
        scored = any(isinstance(o, KeyAttention) for o in observers)
        st = self._state(fused, tokens, rows, scored)
        st.seen += 1
        capture = self.graphs and st.k.device.type == "cuda"
        if capture and st.graph is None and st.seen < st.retry_at:
            return None
        if plan.feed is not None and plan.feed.segments:  # every layer's rows in place
            for i in range(self.adapter.num_layers):
                plan.feed.wait(i)
        # the pass's inputs: no value read back (a != tokens: the padding's)
        st.ids[:a].copy_(plan.ids.index_select(0, plan.active))
        st.pos[:a].copy_(plan.active)
        st.at[:a].copy_(plan.active)
        st.ids[a:].fill_(0)
        st.pos[a:].fill_(rows - 1)
        st.at[a:].fill_(fused.capacity - 1)  # past the whole prompt (a bridge's n is not)
        st.last.fill_(a - 1)
        warming = capture and st.graph is None  # captured now (or failing to be)
        hidden = self._replay(st) if capture else self._step(st)
        fused.length = n
        self.ran += 1
        for o in observers:
            if isinstance(o, LayerCounts):
                o.count_pass(plan.active, self._windows)
            elif isinstance(o, KeyAttention) and st.scored is not None:
                o.take_pass(st.scored[:, :n].clone())  # the shape's buffer: the next pass's
        return LoopResult(hidden=hidden, warming=warming)

    @property
    def shapes(self) -> int:
        """Shapes kept, over every buffer (on CUDA: captured or seen once)."""
        return sum(len(p) for p in self._by_buffer.values())

    def clear(self) -> None:
        """Drop every pass (and its graph and buffer reference)."""
        with self._lock:
            self._by_buffer.clear()

    def _state(self, fused: FusedKV, tokens: int, rows: int, scored: bool) -> _Pass:
        """The pass of this shape over ``fused``'s buffer, made at its first use."""
        k, v = fused.base
        key, shape = (k.data_ptr(), v.data_ptr(), tuple(k.shape), k.dtype), (tokens, rows, scored)
        with self._lock:
            shapes = self._by_buffer.setdefault(key, OrderedDict())
            self._by_buffer.move_to_end(key)
            while len(self._by_buffer) > self.KEPT_BUFFERS:
                self._by_buffer.popitem(last=False)
            if shape not in shapes:
                dev = k.device

                def index(n: int) -> torch.Tensor:
                    return torch.zeros(n, dtype=torch.long, device=dev)

                shapes[shape] = _Pass(
                    k, v, rows, self.adapter.rope(rows, k.dtype, dev), index(tokens),
                    index(tokens), index(tokens), index(1),
                    torch.zeros(k.shape[0], rows, device=dev) if scored else None)
                while len(shapes) > self.KEPT_SHAPES:
                    shapes.popitem(last=False)
            shapes.move_to_end(shape)
            return shapes[shape]

    @torch.inference_mode()
    def _step(self, st: _Pass) -> torch.Tensor:
        """The pass over ``st``'s inputs -> the last real token's final-normed hidden state
        [hidden]."""
        a = self.adapter
        h = a.embed(st.ids)  # [T, hidden]
        rotations: dict[int, Rotation] = {}
        masks: dict[int | None, torch.Tensor | FlexPlan] = {}
        biases: dict[int | None, torch.Tensor] = {}
        whole = FusedKV.over(st.k, st.v)  # the scored pass reads the buffer through it
        explicit = self.explicit and st.ids.shape[0] <= EXPLICIT_TOKENS
        for i, layer in enumerate(a.layers):
            table = st.rope.layer(i)
            if id(table) not in rotations:  # gathered on the device: no sync
                rotations[id(table)] = Rotation(table.cos.index_select(0, st.pos),
                                                table.sin.index_select(0, st.pos))
            q, k, _, v = project(a, layer, h, rotations[id(table)])  # q: [H, T, D]
            st.k[i].index_copy_(1, st.at, k)  # padding: the request KV's last row
            st.v[i].index_copy_(1, st.at, v)
            window = a.sliding_window(i)
            if st.scored is not None or explicit:  # probabilities computed explicitly
                if window not in biases:
                    biases[window] = self._score_bias(st, window)
                o, per_key = attend_scored(a, i, q, whole, st.rows, biases[window],
                                           summed=st.scored is not None)
                if st.scored is not None and per_key is not None:  # the preview's, kept
                    st.scored[i].copy_(per_key)
            else:
                if window not in masks:
                    masks[window] = self._mask(st, window, q.dtype)
                o = self._attend(q, st.k[i], st.v[i], st.rows, masks[window])
            h = finish(a, layer, h, o)
        return a.norm(h.index_select(0, st.last))[0]

    def _mask(self, st: _Pass, window: int | None,
              dtype: torch.dtype) -> torch.Tensor | FlexPlan:
        """Layer masks of ``window`` over the bucket's rows, built on the device: FlexAttention's
        block mask (its plan, ``kernel == "flex"``), boolean for soft-capped attention, else
        additive [T, rows] in ``dtype``."""
        if self.kernel == "flex" and self.adapter.attn_softcap is None \
                and flex_kernel() is not None:
            return FlexPlan(st.pos, st.rows, window, attended_keys=0)
        bias = score_bias(st.pos, st.rows, window)  # [T, rows]: 0 visible, -inf hidden
        return bias == 0 if self.adapter.attn_softcap is not None else bias.to(dtype)

    def _score_bias(self, st: _Pass, window: int | None) -> torch.Tensor:
        """The scored pass's additive float32 mask, [g * T, rows] (``score_bias``'s layout): a
        padded token sees its own row only, so that the attention summed per key below the
        prompt is the real tokens' alone."""
        bias = score_bias(st.pos, st.rows, window)  # [T, rows]
        last = st.rows - 1
        padded = (st.pos == last)[:, None]  # [T, 1]
        bias.masked_fill_(padded, float("-inf"))
        bias[:, last].masked_fill_(padded[:, 0], 0.0)
        groups = self.adapter.num_heads // self.adapter.num_kv_heads
        return bias.repeat(groups, 1) if groups > 1 else bias

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int,
                mask: torch.Tensor | FlexPlan) -> torch.Tensor:
        """q: [H, T, D] over the layer's k, v: [Hkv, capacity, D] -> o: [H, T, D]."""
        a = self.adapter
        if isinstance(mask, FlexPlan):  # over the whole buffer: whole key blocks
            return mask.attend(q, k, v, a.scaling)
        k, v = k[:, :rows], v[:, :rows]  # [Hkv, rows, D]
        if a.attn_softcap is not None:
            return capped_attention(q, k, v, mask, a.scaling, a.attn_softcap)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                              scale=a.scaling, enable_gqa=True)[0]

    def _replay(self, st: _Pass) -> torch.Tensor:
        if st.graph is None or st.out is None:
            try:
                st.graph, st.out = self._capture(st)
                self.captures += 1
            except Exception as exc:  # a kernel that cannot be captured: eager, still exact
                log.warning("cached passes run the layer loop: a CUDA graph could not be "
                            "captured (%s: %s)", type(exc).__name__, exc)
                # out of memory: tried again later, the wait doubling (2, 4, 8... passes of
                # the shape: each try runs the pass three times); else for good
                self.failed = not isinstance(exc, torch.OutOfMemoryError)
                st.backoff *= 2
                st.retry_at = st.seen + st.backoff
                return self._step(st)  # this pass's rows are placed already: finished here
        st.graph.replay()
        self.replays += 1
        return st.out.clone()  # the graph's own tensor: the next replay refills it

    def _capture(self, st: _Pass) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """``st``'s pass captured, and its hidden state, which every replay refills (the
        warm-up runs compute the request's own rows, the same values each time)."""
        return self._pool.capture(partial(self._step, st), st.k.device)
