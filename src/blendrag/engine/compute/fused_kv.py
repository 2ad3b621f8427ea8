"""The request's KV: one static buffer per request (gpt-fast style), rotated keys.

Rows come from two places: cached chunk KVs, rotated to their positions in this request,
and tokens the request computes, which overwrite their rows.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from blendrag.config import Ape
from blendrag.engine.compute.attention import pad_rows
from blendrag.engine.compute.observers import OFF, PhaseClock
from blendrag.model.rope import RopeTable
from blendrag.store.layered import LayeredEntry

# (the tensor the views were made of, each layer's keys, each layer's values)
_LayerViews = tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]


@dataclass
class CachedSegment:
    """Cached rows placed at ``start`` in the request: a stored entry opened for layer-wise
    reads, or a chunk computed by this request (``tier == "computed"``), both as a
    ``blendrag.store.layered.LayeredEntry``; the loop reads it through ``kv.layer(i)`` only."""

    start: int
    kv: LayeredEntry

    @property
    def end(self) -> int:
        return self.start + self.kv.num_tokens


class FusedKV:
    """k, v: [layers, kv_heads, capacity, head_dim]; rows [0, length) are valid after prefill.
    ``base``: the whole tensors k and v are views of (the pooled buffer): kernels that read
    whole blocks of keys (FlexAttention, the fixed-shape decoding step of engine/compute/decode.py)
    run
    over it and mask what lies past the prompt.

    A buffer is zeroed when it is made, and every row written later is a key or value the model
    computed: a row that a kernel reads and masks never holds a NaN (a masked NaN is still NaN:
    0 x NaN).

    A pooled buffer lent again still holds the last request's rows, perhaps another tenant's:
    before this request's first pass (``drop_earlier_rows``) the rows past its prompt up to the
    end of what earlier requests wrote are zeroed, so that no pass reads them (a masked row
    that an earlier request filled with inf, an fp16 overflow, would still be NaN) and what the
    caller gets back (``k``, ``v``, ``base``) holds no row of another request."""

    def __init__(self, layers: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.zeros(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.base = self.k, self.v
        self._length = 0
        self._written: Extent | None = None  # set by the pool: rows earlier requests wrote
        # APE (engine/selection/ape.py): its settings and, per layer, the rows reused: [layers,
        # capacity]
        self.ape: Ape | None = None
        self.ape_stale: torch.Tensor | None = None
        self._views: _LayerViews | None = None  # ``layer``'s, made at its first call
        self._base_views: _LayerViews | None = None

    @classmethod
    def over(cls, k: torch.Tensor, v: torch.Tensor,
             base: tuple[torch.Tensor, torch.Tensor] | None = None) -> FusedKV:
        """A request KV over existing storage (views of ``base``, a pooled buffer)."""
        fused = cls.__new__(cls)
        fused.k, fused.v, fused._length = k, v, 0
        fused.base = base if base is not None else (k, v)
        fused.ape, fused.ape_stale = None, None
        fused._written = None
        fused._views = fused._base_views = None
        return fused

    @property
    def length(self) -> int:
        """Rows [0, length) hold this request's keys and values."""
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        self._length = n

    def drop_earlier_rows(self, start: int | None = None) -> None:
        """Zero the rows from ``start`` (default ``length``) to the end of what earlier
        requests wrote into the pooled buffer (once). A request calls it with its prompt's
        length before its first pass: the layer feed places rows before that, never past it."""
        written = self._written
        if written is None:
            return
        self._written = None
        k, v = self.base  # [layers, kv_heads, rows, head_dim]
        n = self._length if start is None else start
        if written.rows > n:
            k[:, :, n:written.rows] = 0
            v[:, :, n:written.rows] = 0
        written.rows = self.capacity  # what this request may write from now on (decoding)

    def track(self, written: Extent) -> None:
        """Zero, before the request's first pass, the rows earlier requests wrote up to
        ``written.rows`` in the storage this request KV is lent (a pooled buffer, a slab's
        slot: ``drop_earlier_rows``)."""
        self._written = written

    def move_to(self, target: FusedKV) -> None:
        """Move this request KV's rows into ``target`` (a slab's slot: engine/compute/slab.py)
        and hold ``target``'s storage from now on: rows [0, length) copied, in one copy each for
        keys and values, and the target's rows past them that earlier requests wrote zeroed. The
        storage held before goes back to whoever lent it (the buffer pool) once nothing else
        holds it."""
        n = self._length
        if target.capacity < self.capacity or target.k.shape[:2] != self.k.shape[:2]:
            raise ValueError(f"request KV rows of shape {tuple(self.k.shape)} do not fit "
                             f"{tuple(target.k.shape)}")
        target.k[:, :, :n] = self.k[:, :, :n]  # [layers, Hkv, n, D]
        target.v[:, :, :n] = self.v[:, :, :n]
        target.length = n
        target.drop_earlier_rows()
        self.k, self.v, self.base = target.k, target.v, target.base
        self._written = None

    def forget(self) -> None:
        """Let go of the rows: the storage goes to another request (a slab's slot), so whoever
        still holds this request KV (a served request's ``Prefill``) reads no row of it."""
        self.k, self.v = self.k[:, :, :0], self.v[:, :, :0]
        self.base = self.k, self.v
        self._length, self._written = 0, None

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def place(self, layers: slice, segments: list[CachedSegment],
              rows: list[tuple[torch.Tensor, torch.Tensor]], rope: RopeTable,
              clock: PhaseClock = OFF) -> None:
        """Write the cached rows of ``layers`` (one layer or many, all rotating with the table
        ``rope``): ``rows[j]`` = (pre-RoPE keys, values) of ``segments[j]``, each
        [layers, Hkv, T, D] (read by the layer feed); values and keys copied into their rows of
        this request, one copy each per segment for all the layers, then the keys of each run
        of adjacent segments rotated where they lie, by one set of kernels for all the layers
        (not one per segment, nor per layer: a request's launches on a GPU; on a CPU a block
        of layers that fits its caches at a time, ``rope.SCRATCH_BYTES``).

        Copied first, rotated after, in the buffer's dtype: the rows a stored dtype other than
        the model's gives are rounded to it before they are rotated, as a layer's own keys are."""
        for seg, (k, v) in zip(segments, rows):
            # [layers, Hkv, T, D], cast to the buffer's dtype
            self.v[layers, :, seg.start:seg.end] = v
            self.k[layers, :, seg.start:seg.end] = k
        clock.lap("load")
        for start, end in _runs(segments):
            rope.at(slice(start, end)).rotate_in_place(self.k[layers, :, start:end])
        clock.lap("rotate")

    def write(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """pos: [A] positions; k, v: [Hkv, A, D] (k rotated)."""
        k_rows, v_rows = self.layer(layer)
        k_rows.index_copy_(1, pos, k)
        v_rows.index_copy_(1, pos, v)

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s keys and values, [Hkv, capacity, D] views. Every layer's are made at
        once, at the first call over this storage: a loop writing a layer's rows and attending
        over them would otherwise make each view again (a host dispatch each, per layer and per
        request packed into a forward)."""
        self._views = _per_layer(self._views, self.k, self.v)
        return self._views[1][i], self._views[2][i]

    def base_layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer`` over ``base``, the whole buffer: what kernels that read whole key blocks
        attend over."""
        self._base_views = _per_layer(self._base_views, *self.base)
        return self._base_views[1][i], self._base_views[2][i]

    def rows(self, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v of ``layer`` for positions [0, n): [Hkv, n, D] each (views)."""
        return self.k[layer, :, :n], self.v[layer, :, :n]


def _per_layer(views: _LayerViews | None, k: torch.Tensor, v: torch.Tensor) -> _LayerViews:
    """``views`` when they were made of ``k``, else ``k`` and ``v`` cut into their layers."""
    if views is not None and views[0] is k:
        return views
    return k, k.unbind(0), v.unbind(0)


class Extent:
    """How many leading rows of a pooled buffer may hold something other than zeros."""

    def __init__(self, rows: int) -> None:
        self.rows = rows


class BufferPool:
    """Keeps the last request's KV buffer and lends it to the next request once nothing uses it.

    A fresh buffer costs more than its allocation: on the CPU a buffer of tens of MB is a new
    mmap whose pages fault on first touch, which was a third of the rows' load time. A request
    gets views of the pooled tensors; the pool lends them again only when no view of them is
    alive (the storage's use count: the pooled tensor plus the probe itself), so a caller that
    keeps a Prefill, its FusedKV or any slice of it keeps its rows. One buffer is kept, the
    largest asked for so far; ``clear()`` drops it. The pool records how far requests wrote
    into it (``Extent``): a request it is lent to zeroes the rows past its own length up to
    there (``FusedKV.drop_earlier_rows``), which costs only the rows another request left
    behind.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None
        self._written = Extent(0)

    def take(self, layers: int, kv_heads: int, capacity: int, head_dim: int,
             dtype: torch.dtype, device: torch.device) -> FusedKV:
        """A request KV of ``capacity`` rows: views of the pooled buffer when it fits and is
        free, else a new buffer (which the pool keeps if it holds none, or only a smaller one)."""
        with self._lock:  # concurrent requests must not both see the buffer free
            kv = self._kv
            fits = (kv is not None and kv[0].dtype == dtype and kv[0].device == device
                    and kv[0].shape[2] >= capacity
                    and (kv[0].shape[0], kv[0].shape[1], kv[0].shape[3])
                    == (layers, kv_heads, head_dim))
            if kv is not None and fits and _unused(kv[0]) and _unused(kv[1]):
                lent = FusedKV.over(kv[0][:, :, :capacity], kv[1][:, :, :capacity], kv)
                # a request that stops early (a failed attempt) may leave rows up to here
                self._written.rows = max(self._written.rows, capacity)
                lent.track(self._written)
                return lent
            # whole FlexAttention key blocks: shapes that repeat (engine/compute/attention.py)
            fused = FusedKV(layers, kv_heads, pad_rows(capacity), head_dim, dtype, device)
            if kv is None or not fits:
                self._kv = fused.k, fused.v
                self._written = Extent(capacity)  # fresh zeros: only this request writes
                return FusedKV.over(fused.k[:, :, :capacity], fused.v[:, :, :capacity],
                                    self._kv)
            return FusedKV.over(fused.k[:, :, :capacity], fused.v[:, :, :capacity],
                                (fused.k, fused.v))

    def lent(self, fused: FusedKV) -> bool:
        """Whether ``fused`` is a view of the pooled buffer (not one made beside it)."""
        kv = self._kv
        return kv is not None and fused.base[0] is kv[0]

    def clear(self) -> None:
        with self._lock:
            self._kv = None
            self._written = Extent(0)


def _runs(segments: list[CachedSegment]) -> list[tuple[int, int]]:
    """The [start, end) of each run of segments that lie side by side in the request."""
    runs: list[tuple[int, int]] = []
    for seg in sorted(segments, key=lambda s: s.start):
        if runs and runs[-1][1] == seg.start:
            runs[-1] = (runs[-1][0], seg.end)
        else:
            runs.append((seg.start, seg.end))
    return runs


def _unused(t: torch.Tensor) -> bool:
    """Whether only the pool's tensor ``t`` refers to its storage (no view lent out is alive)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:  # a torch without the counter: never lend a buffer twice
        return False
    # the pooled tensor and the storage handle made for this probe
    return count(t.untyped_storage()._cdata) <= 2
