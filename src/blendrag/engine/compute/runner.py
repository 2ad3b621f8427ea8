"""The model runner: one HF decoder-only model and what running it takes (its family adapter,
the request KV buffers, RoPE tables, the layer loop, decoding and logits). It knows nothing of
the store's tiers or keys: the chunk cache and the request path hand it plans and cached rows,
read through the one layer-wise interface (``store.layered``), which a chunk it computes is
wrapped in too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from blendrag.engine.compute.attention import kernel_for
from blendrag.engine.compute.batch_decode import batchable, decode_batch
from blendrag.engine.compute.buckets import ladder
from blendrag.engine.compute.decode import StaticDecoder, static_rope
from blendrag.engine.compute.fused_kv import BufferPool, CachedSegment, FusedKV
from blendrag.engine.compute.layer import attend, finish, project
from blendrag.engine.compute.layer_feed import LayerFeed
from blendrag.engine.compute.loop import ActiveTokens, LoopPlan, LoopResult, run_layers
from blendrag.engine.compute.observers import OFF, CapturedRows, LayerObserver, PhaseClock
from blendrag.engine.compute.packed import Lane, run_packed
from blendrag.engine.compute.pieces import PrefillPieces, run_in_pieces
from blendrag.engine.compute.slab import KVSlab
from blendrag.engine.compute.slab_step import SlabStep
from blendrag.engine.compute.static_pass import StaticPasses
from blendrag.engine.selection.ape import ape_attention, ape_bias
from blendrag.engine.selection.costs import DeviceCosts
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.keys import hash_ids
from blendrag.model.adapters import adapter_for
from blendrag.model.rope import RopeTables
from blendrag.store.layered import MemoryLayeredEntry

DECODE_MODES = ("auto", "graph", "eager")
PASS_MODES = DECODE_MODES
PASS_ATTENTION = ("kernel", "explicit")


@dataclass(frozen=True)
class ComputeConfig:
    """How the engine computes; every choice runs the same exact arithmetic.

    attention: the layer loop's attention kernel (engine/compute/attention.py): ``auto``
      (FlexAttention on CUDA for scattered queries and windows, PyTorch's SDPA elsewhere),
      ``sdpa`` or ``flex``.
    decode: how each token is decoded (engine/compute/decode.py): ``auto`` (a CUDA graph of the
      step on CUDA when the model's RoPE allows it, eager elsewhere), ``graph`` (the fixed-shape
      step, replayed from a CUDA graph on CUDA, run eagerly elsewhere) or ``eager``.
    passes: how a cached pass that computes a few tokens runs (engine/compute/static_pass.py):
      ``auto`` (with fixed shapes per bucket, replayed from CUDA graphs, on CUDA when the
      model's RoPE allows it; the layer loop elsewhere), ``graph`` (the fixed-shape pass, run
      eagerly off CUDA) or ``eager`` (the layer loop).
    pass_attention: the attention of those fixed-shape passes: ``kernel`` (the engine's
      ``attention`` kernel over the exact mask) or ``explicit`` (the probabilities in float32
      with the exact mask added in the matmul, then one batched GEMM with the values, as the
      preview pass computes them, in passes of at most ``static_pass.EXPLICIT_TOKENS``
      tokens: for a few queries over many keys the GEMMs spread the keys over the whole
      device, where a kernel's tile of queries walks them alone; the GPU check's attention
      phase times both).
    """

    attention: str = "auto"
    decode: str = "auto"
    passes: str = "auto"
    pass_attention: str = "kernel"

    def __post_init__(self) -> None:
        kernel_for(self.attention, torch.device("cpu"))  # raises for an unknown kernel
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {self.decode!r}")
        if self.passes not in PASS_MODES:
            raise ValueError(f"passes must be one of {PASS_MODES}, got {self.passes!r}")
        if self.pass_attention not in PASS_ATTENTION:
            raise ValueError(f"pass_attention must be one of {PASS_ATTENTION}, got "
                             f"{self.pass_attention!r}")


class ModelRunner:
    """Runs ``model`` (eval mode) on the device its weights are on, in their dtype, as
    ``compute`` says."""

    def __init__(self, model: torch.nn.Module, compute: ComputeConfig | None = None) -> None:
        self.model = model.eval()
        self.adapter = adapter_for(model)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.compute = compute or ComputeConfig()
        self.kernel = kernel_for(self.compute.attention, self.device)
        self._pool = BufferPool()  # the request KV buffer, lent again once free
        self._static = static_rope(self.adapter)  # RoPE gathered at any positions at once
        cuda = self.device.type == "cuda"
        self._decoder = (StaticDecoder(self.adapter, graphs=cuda)
                         if self._fixed_shapes(self.compute.decode) else None)
        self._passes = (StaticPasses(self.adapter, self.kernel, graphs=cuda,
                                     explicit=self.compute.pass_attention == "explicit")
                        if self._fixed_shapes(self.compute.passes) else None)
        self.cost_profile: DeviceCosts | None = None  # measured by ``costs()`` when needed
        # the served requests' slabs, one per (slots, rows), each with its step
        self._slabs: dict[tuple[int, int], SlabStep] = {}

    @property
    def max_positions(self) -> int:
        return self.adapter.max_positions

    # ---- what a run needs ----------------------------------------------------------------

    def buffer(self, capacity: int) -> FusedKV:
        """A request KV of ``capacity`` rows (views of the pooled buffer when it is free); with
        static passes at least one row more, up to the next size of their ladder
        (engine/compute/static_pass.py: a row past the prompt for the padding, and one buffer
        size for prompts of similar lengths, whose captured passes it keeps)."""
        a = self.adapter
        return self._pool.take(a.num_layers, a.num_kv_heads, self.rows_for(capacity),
                               a.head_dim, self.dtype, self.device)

    def rows_for(self, capacity: int) -> int:
        """The rows a request KV asked for ``capacity`` rows holds (what a KV pool counts)."""
        return ladder(capacity + 1) if self._passes is not None else capacity

    def slab(self, slots: int, rows: int) -> KVSlab | None:
        """The slab of ``slots`` request KVs of ``rows`` rows for requests served at once
        (engine/compute/slab.py), made at the first call and the same one after it (the
        scheduler's: schedulers of one model with the same limits share it, and their steps
        take turns); None when this model's RoPE cannot be gathered at any position from one
        table (``decode.static_rope``): its requests keep buffers of their own."""
        if not self._static:
            return None
        step = self._slabs.get((slots, rows))
        if step is None:
            a = self.adapter
            slab = KVSlab(slots, rows, a.num_layers, a.num_kv_heads, a.head_dim, self.dtype,
                          self.device)
            graphs = self.device.type == "cuda" and self.compute.decode != "eager"
            step = self._slabs[slots, rows] = SlabStep(a, slab, graphs)
        return step.slab

    def slab_step(self, slab: KVSlab) -> SlabStep:
        """The batched step over ``slab`` (engine/compute/slab_step.py)."""
        step = self._slabs.get((slab.slots, slab.rows))
        if step is None or step.slab is not slab:
            raise ValueError("the slab is not this runner's (ModelRunner.slab)")
        return step

    def decode_slab(self, slab: KVSlab, tokens: Sequence[int], slots: Sequence[int],
                    kvs: Sequence[FusedKV]) -> torch.Tensor:
        """Append ``tokens[j]`` to request KV ``kvs[j]``, the view of slot ``slots[j]`` of
        ``slab``, for every j, in one step (one attention call per layer) -> their next-token
        logits [N, vocab] float32."""
        return self.slab_step(slab).decode(tokens, slots, kvs)

    def costs(self) -> DeviceCosts:
        """This runner's cost profile (engine/selection/costs.py): ``cost_profile``, measured at
        the first
        call when none was given."""
        if self.cost_profile is None:
            self.cost_profile = DeviceCosts.profile(self)
        return self.cost_profile

    @property
    def static_decoder(self) -> StaticDecoder | None:
        """The fixed-shape decoding step (engine/compute/decode.py), when this runner decodes with
        it."""
        return self._decoder

    def release_buffers(self) -> None:
        """Drop the pooled request KV buffer (kept between requests; ``engine/compute/fused_kv.py``)
        and the decoding steps made over it, and the slabs no served request holds a slot of."""
        self._pool.clear()
        for key, step in list(self._slabs.items()):  # those no request holds a slot of
            if step.slab.retire():  # none lent, and none can be from now on
                del self._slabs[key]
        if self._decoder is not None:
            self._decoder.clear()
        if self._passes is not None:
            self._passes.clear()

    def _fixed_shapes(self, mode: str) -> bool:
        """Whether a step set to ``mode`` (``DECODE_MODES``) runs with fixed shapes: ``graph``,
        or ``auto`` on CUDA, where the model's RoPE gives a position the same cos/sin in a
        table of any length (``decode.static_rope``)."""
        wanted = mode == "graph" or (mode == "auto" and self.device.type == "cuda")
        return wanted and self._static

    @property
    def static_passes(self) -> StaticPasses | None:
        """The fixed-shape cached passes (engine/compute/static_pass.py), when this runner runs
        them."""
        return self._passes

    def rope(self, n: int) -> RopeTables:
        """cos/sin of positions [0, n) for every layer, from the model's own rotary embedding."""
        return self.adapter.rope(n, self.dtype, self.device)

    def feed(self, segments: Sequence[CachedSegment], fused: FusedKV, rope: RopeTables,
             depth: int = 0, place_ahead: bool = True) -> LayerFeed:
        """The cached rows of ``segments`` placed into ``fused`` layer by layer, ``depth``
        layers ahead (engine/compute/layer_feed.py)."""
        return LayerFeed(segments, self.adapter.num_layers, fused, rope, depth, place_ahead)

    # ---- running -------------------------------------------------------------------------

    def run(self, plan: LoopPlan, fused: FusedKV, rope: RopeTables,
            observers: tuple[LayerObserver, ...] = (), clock: PhaseClock = OFF,
            pieces: PrefillPieces | None = None) -> LoopResult:
        """Every layer of ``plan``: a fixed-shape pass (engine/compute/static_pass.py) when
        the runner has them and the plan is one, else the layer loop (engine/compute/loop.py);
        with ``pieces``, a long pass in pieces (engine/compute/pieces.py), each run so."""
        if pieces is not None and clock is OFF:
            spans = pieces.spans(plan, observers)
            if spans is not None:
                # each piece in the layer loop: hundreds of tokens gain little from a replay,
                # and a long prompt's pieces would crowd the captured passes' shapes out
                return run_in_pieces(lambda piece, seen: run_layers(
                    self.adapter, piece, fused, rope, seen, OFF, self.kernel),
                    plan, observers, pieces, spans)
        passes, warming = self._passes, False
        if (passes is not None and clock is OFF and self._pool.lent(fused)
                and passes.takes(plan, fused, observers)):
            out = passes.run(plan, fused, observers)
            if out is not None:
                return out
            warming = True  # its shape seen once: captured when it comes again
        out = run_layers(self.adapter, plan, fused, rope, observers, clock, self.kernel)
        out.warming = warming
        return out

    def run_packed(self, lanes: Sequence[Lane]) -> list[LoopResult | BaseException]:
        """Several requests' plans, each over its own request KV, in one forward
        (engine/compute/packed.py) -> per lane, its result or the error that stopped it."""
        return run_packed(self.adapter, lanes, self.kernel)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [hidden] (final-normed) -> logits [vocab] in float32 (soft-capped where the
        family caps them)."""
        with torch.inference_mode():
            return self.adapter.logits(hidden[None])[0].float()

    @torch.inference_mode()
    def decode(self, token: int, fused: FusedKV) -> torch.Tensor:
        """Append ``token`` at position ``fused.length``; its next-token logits [vocab] float32:
        a step of fixed shape (engine/compute/decode.py) when ``compute.decode`` asks for one, else
        eagerly.

        Eagerly, cos/sin come from ``rotary_emb`` at this one position, as HF's generate does
        (it matters for dynamic NTK, whose frequencies depend on the current length)."""
        if self._decoder is not None and fused.ape is None:
            return self._decoder.decode(token, fused)
        p, a = fused.length, self.adapter
        if p >= fused.capacity:
            raise ValueError(f"the KV buffer is full ({fused.capacity} rows)")
        rope = a.rope(p + 1, fused.k.dtype, fused.k.device, start=p)
        pos = torch.tensor([p], device=fused.k.device)
        h = a.embed(pos.new_tensor([token]))  # [1, hidden]
        active = ActiveTokens(pos, p + 1, a, self.kernel, fused.k.dtype)
        for i, layer in enumerate(a.layers):
            q, k, _, v = project(a, layer, h, active.rotation(rope.layer(i)))
            fused.write(i, pos, k, v)
            if fused.ape is not None and fused.ape_stale is not None:  # engine/selection/ape.py
                mult, add = ape_bias(pos, fused.ape_stale[i, :p + 1], fused.ape,
                                     a.sliding_window(i))  # the rows layer i reused
                o = ape_attention(q, fused.k[i, :, :p + 1], fused.v[i, :, :p + 1], mult, add,
                                  a.scaling)
            else:
                o = attend(a, i, q, fused, active.plan(a.sliding_window(i)))
            h = finish(a, layer, h, o)
        fused.length = p + 1
        return self.logits(a.norm(h)[0])

    def decode_many(self, tokens: Sequence[int], kvs: Sequence[FusedKV]) -> torch.Tensor:
        """Append ``tokens[j]`` to request KV ``kvs[j]`` for every j -> their next-token logits
        [N, vocab] float32: one batched forward for the requests that may share one
        (engine/compute/batch_decode.py), each other request decoded alone. One request alone
        takes :meth:`decode` (on CUDA its captured step)."""
        static = self._static
        together = [j for j, kv in enumerate(kvs) if batchable(kv, static)]
        if len(together) < 2:
            together = []
        rows: dict[int, torch.Tensor] = {}
        lengths = [kv.length for kv in kvs]
        try:
            if together:
                out = decode_batch(self.adapter, self.kernel, [tokens[j] for j in together],
                                   [kvs[j] for j in together])
                rows.update(zip(together, out))
            for j, kv in enumerate(kvs):
                if j not in rows:
                    rows[j] = self.decode(tokens[j], kv)
        except BaseException:  # none appended: a caller that retries appends each token once
            for kv, n in zip(kvs, lengths):
                kv.length = n
            raise
        return torch.stack([rows[j] for j in range(len(kvs))])

    def compute_chunk(self, prefix: ChunkKV | None, prefix_ids: Sequence[int],
                      chunk_ids: Sequence[int]) -> ChunkKV:
        """``chunk_ids``'s rows (pre-RoPE keys) computed after ``prefix_ids``.

        A short prefix is computed again with the chunk: one plain causal block takes the fast
        attention kernel, which costs less than the masked attention of chunk queries over
        cached prefix rows. A long prefix (over a quarter of the chunk) comes from ``prefix``,
        its KV. Uses the pooled buffer: call it before a request takes the buffer."""
        p, n = len(prefix_ids), len(prefix_ids) + len(chunk_ids)
        ids = torch.tensor([*prefix_ids, *chunk_ids], device=self.device)
        fused, rope = self.buffer(n), self.rope(n)
        if prefix is None or 4 * p <= n - p:
            plan = LoopPlan(ids, torch.arange(0, n, device=self.device))
        else:
            segment = CachedSegment(0, MemoryLayeredEntry(prefix))
            plan = LoopPlan(ids, torch.arange(p, n, device=self.device),
                            feed=self.feed([segment], fused, rope))
        rows = CapturedRows()
        self.run(plan, fused, rope, (rows,))
        t = len(chunk_ids)  # the captured rows are the computed ones; the chunk's are the last
        return ChunkKV(rows.keys[:, :, -t:].contiguous(), rows.values[:, :, -t:].contiguous(),
                       tuple(chunk_ids), hash_ids(prefix_ids) if prefix_ids else "")
