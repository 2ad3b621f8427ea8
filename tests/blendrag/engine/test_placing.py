"""Placing cached rows (``FusedKV.place`` through the layer feed): every layer at once when every
entry is in memory, else a layer at a time; either way the rows of HF's own rotation, bit for
bit, and a number of ops per request that does not grow with the layers when whole."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from blendrag.engine.compute.fused_kv import CachedSegment
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.model.rope import RopeTable
from blendrag.store.layered import LayeredEntryWrapper, MemoryLayeredEntry

# (start, tokens) of each segment: one run; runs with gaps; after rows that are not cached (a
# prefix computed or taken from the prefix cache)
LAYOUTS = {
    "adjacent": [(0, 8), (8, 5), (13, 7)],
    "gaps": [(2, 6), (12, 4), (16, 3), (25, 9)],
    "after-prefix": [(10, 6), (16, 6)],
}
# views: no kernel (what a TorchDispatchMode sees of slicing a tensor)
VIEWS = {"slice", "select", "unsqueeze", "view", "as_strided", "alias", "expand", "detach",
         "t", "transpose", "_unsafe_view"}


class Ops(TorchDispatchMode):
    """The aten ops run on this thread that are not views: the kernels of a device."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


class Unread(LayeredEntryWrapper):
    """An entry not read yet (a disk or Redis entry): the feed places it a layer at a time."""

    @property
    def complete(self) -> bool:
        return False


def segments_of(engine, layout, stored: torch.dtype, seed: int = 0) -> list[CachedSegment]:
    a, g = engine.adapter, torch.Generator().manual_seed(seed)
    out = []
    for start, t in layout:
        shape = (a.num_layers, a.num_kv_heads, t, a.head_dim)  # [L, Hkv, T, D]
        k = torch.randn(shape, generator=g).to(stored)
        v = torch.randn(shape, generator=g).to(stored)
        out.append(CachedSegment(start, MemoryLayeredEntry(ChunkKV(k, v, (1,) * t))))
    return out


def placed(engine, segments, n: int, depth: int = 0, whole: bool = True):
    """The request KV after the feed placed ``segments``, rows it did not place NaN."""
    runner = engine.runner
    fused, rope = runner.buffer(n), runner.rope(n)
    fused.k.fill_(float("nan"))
    fused.v.fill_(float("nan"))
    if not whole:
        segments = [CachedSegment(s.start, Unread(s.kv)) for s in segments]
    feed = runner.feed(segments, fused, rope, depth=depth)
    with torch.inference_mode():
        for i in range(engine.adapter.num_layers):
            feed.wait(i)
    feed.close()
    return fused, rope


def reference(engine, segments, n: int):
    """HF's rotation, ``x * cos + rotate_half(x) * sin``, of each segment's keys at each layer
    (in the buffer's dtype, as a full prefill rotates its own keys), values as they are."""
    from transformers.models.llama.modeling_llama import rotate_half

    a, dtype, rope = engine.adapter, engine.dtype, engine.runner.rope(n)
    k = torch.full((a.num_layers, a.num_kv_heads, n, a.head_dim), float("nan"), dtype=dtype)
    v = k.clone()
    for i in range(a.num_layers):
        table: RopeTable = rope.layer(i)
        r = table.cos.shape[-1]
        for seg in segments:
            rows = slice(seg.start, seg.end)
            x = seg.kv.kv.keys[i].to(dtype)  # [Hkv, T, D]
            cos, sin = table.cos[rows], table.sin[rows]
            k[i, :, rows] = x
            k[i, :, rows, :r] = x[..., :r] * cos + rotate_half(x[..., :r]) * sin
            v[i, :, rows] = seg.kv.kv.values[i].to(dtype)
    return k, v


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("family,dtype,stored", [
    ("llama", "float32", torch.float32),
    ("llama", "bfloat16", torch.bfloat16),
    ("llama", "bfloat16", torch.float32),  # rows stored wider than the model: rounded first
    ("gemma3", "float32", torch.float32),  # a RoPE table per kind of layer
    ("gemma3", "bfloat16", torch.bfloat16),
    ("olmo2", "bfloat16", torch.bfloat16),  # cos/sin in float32
    ("phi3", "bfloat16", torch.bfloat16),  # partial rotary
])
def test_placing_every_layer_at_once_is_hf_rope_bit_for_bit(engine_for, family, dtype, stored,
                                                           layout):
    kw = {"partial_rotary_factor": 0.75} if family == "phi3" else {}
    engine = engine_for(family, dtype=dtype, layers=4, **kw)
    segments = segments_of(engine, LAYOUTS[layout], stored)
    n = max(s.end for s in segments) + 3  # rows after the last segment: not placed
    ref_k, ref_v = reference(engine, segments, n)
    for depth, whole in ((0, True), (2, True), (0, False), (2, False)):
        fused, _ = placed(engine, segments, n, depth, whole)
        assert same_bits(fused.k[:, :, :n], ref_k), (depth, whole)
        assert same_bits(fused.v[:, :, :n], ref_v), (depth, whole)


def test_rotating_a_block_of_layers_bounds_its_scratch(engine_for, monkeypatch):
    """Layers beyond the scratch bound are rotated a block at a time, with the same bits."""
    import blendrag.model.rope as rope_module

    engine = engine_for("llama", dtype="bfloat16", layers=4)
    segments = segments_of(engine, LAYOUTS["adjacent"], torch.bfloat16)
    n = 24
    a = engine.adapter
    one_layer = a.num_kv_heads * 20 * a.head_dim * 2  # the run's keys of a layer, bf16
    placed_at = {}
    for bound in (1 << 40, one_layer, 3 * one_layer):  # one block; blocks of 1; of 3 then 1
        monkeypatch.setitem(rope_module.SCRATCH_BYTES, "cpu", bound)
        placed_at[bound], _ = placed(engine, segments, n)
    whole = placed_at.pop(1 << 40).k[:, :, :n]
    assert all(same_bits(f.k[:, :, :n], whole) for f in placed_at.values())


def placing_ops(engine, segments, n: int, whole: bool) -> Counter[str]:
    """The ops of placing every layer (sequential: on this thread), the tables made first."""
    runner = engine.runner
    fused, rope = runner.buffer(n), runner.rope(n)
    if not whole:
        segments = [CachedSegment(s.start, Unread(s.kv)) for s in segments]
    feed = runner.feed(segments, fused, rope, depth=0)
    ops = Ops()
    with torch.inference_mode(), ops:
        for i in range(engine.adapter.num_layers):
            feed.wait(i)
    return ops.ops


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_placing_every_layer_takes_ops_per_segment_not_per_layer(engine_for, layout):
    """Whole: one copy of keys and one of values per segment and four kernels per run of
    adjacent segments (and the swapped sin table, once), whatever the number of layers; a
    layer at a time, as many per layer."""
    spans = LAYOUTS[layout]
    runs = 1 + sum(a[0] + a[1] != b[0] for a, b in zip(spans, spans[1:]))
    counts = {}
    for layers in (2, 4):
        engine = engine_for("llama", layers=layers)
        segments = segments_of(engine, spans, torch.float32)
        n = max(s.end for s in segments)
        counts[layers] = (sum(placing_ops(engine, segments, n, True).values()),
                          sum(placing_ops(engine, segments, n, False).values()))
    per_place = 2 * len(spans) + 4 * runs
    assert counts[2][0] == counts[4][0] == per_place + 1, counts
    assert counts[4][1] - counts[2][1] == 2 * per_place, counts


@pytest.mark.parametrize("family", ["llama", "gemma3"])  # gemma3: blocks end where tables do
def test_rows_still_to_read_come_a_block_of_layers_at_a_time(engine_for, family, monkeypatch):
    """Rows not read yet (disk, Redis, S3) are placed a block of layers at a time: the rows of
    HF's rotation bit for bit, pipelined or not, in half the ops of a layer at a time when the
    blocks hold two layers."""
    import blendrag.engine.compute.layer_feed as layer_feed

    engine = engine_for(family, dtype="bfloat16", layers=16)
    spans = LAYOUTS["gaps"]
    segments = segments_of(engine, spans, torch.bfloat16)
    n = max(s.end for s in segments) + 3
    ref_k, ref_v = reference(engine, segments, n)
    assert layer_feed.block_layers(segments, 16) == 2  # 16 layers in MIN_BLOCKS = 8 blocks
    for depth in (0, 2):
        fused, _ = placed(engine, segments, n, depth, whole=False)
        assert same_bits(fused.k[:, :, :n], ref_k), depth
        assert same_bits(fused.v[:, :, :n], ref_v), depth
    if family != "llama":
        return
    blocks = sum(placing_ops(engine, segments, n, False).values())
    monkeypatch.setattr(layer_feed, "MIN_BLOCKS", 16)  # blocks of one layer
    layers = sum(placing_ops(engine, segments, n, False).values())
    runs = 1 + sum(a[0] + a[1] != b[0] for a, b in zip(spans, spans[1:]))
    per_place = 2 * len(spans) + 4 * runs
    assert layers - blocks == 8 * per_place, (layers, blocks)


def test_rows_on_the_device_already_start_no_reader(engine_for):
    """A feed whose rows are all read and on the request KV's device (RAM on a CPU, the device
    tier on a GPU) places them at the first wait on the loop's thread, whatever its depth: no
    reader thread to start and hand over (the same rows as sequential placing); a feed with
    rows still to read starts one."""
    engine = engine_for("llama", layers=4)
    segments = segments_of(engine, LAYOUTS["gaps"], torch.float32)
    n = max(s.end for s in segments)
    runner = engine.runner
    fused, rope = runner.buffer(n), runner.rope(n)
    feed = runner.feed(segments, fused, rope, depth=3)
    assert feed.resident and not feed.pipelined and feed._thread is None
    feed.close()
    unread = runner.feed([CachedSegment(s.start, Unread(s.kv)) for s in segments], fused, rope,
                         depth=3)
    assert unread.pipelined and unread._thread is not None
    with torch.inference_mode():
        for i in range(engine.adapter.num_layers):
            unread.wait(i)
    unread.close()
    ahead, _ = placed(engine, segments, n, depth=3)
    alone, _ = placed(engine, segments, n, depth=0)
    assert same_bits(ahead.k, alone.k) and same_bits(ahead.v, alone.v)


def test_a_block_of_layers_is_a_view_of_the_rows_it_lies_in():
    """``joined``: consecutive layers of one stacked buffer as one view (nothing copied); any
    other layers stacked, the same values."""
    from blendrag.engine.compute.layer_feed import joined

    stacked = torch.arange(4 * 2 * 3 * 5, dtype=torch.float32).view(4, 2, 3, 5)
    view = joined([stacked[1], stacked[2], stacked[3]])
    assert view.data_ptr() == stacked[1].data_ptr() and torch.equal(view, stacked[1:])
    out_of_order = joined([stacked[2], stacked[1]])
    assert out_of_order.data_ptr() != stacked.data_ptr()
    assert torch.equal(out_of_order, stacked[[2, 1]])
    assert torch.equal(joined([stacked[0]]), stacked[:1])
    apart = [torch.randn(2, 3, 5), torch.randn(2, 3, 5)]
    assert torch.equal(joined(apart), torch.stack(apart))


def test_layers_at_one_stride_in_a_larger_buffer_are_one_view_too():
    """A slice of a request KV's rows, [L, Hkv, n, D] of a larger buffer (history rows), is
    joined by a view; layers of another dtype's alias are not taken for it."""
    from blendrag.engine.compute.layer_feed import joined

    k = torch.randn(4, 2, 10, 3)
    rows = k[:, :, 2:6]  # [L, Hkv, 4, D]: not contiguous
    view = joined([rows[1], rows[2]])
    assert view.data_ptr() == rows[1].data_ptr() and torch.equal(view, rows[1:3])
    alias = k[2].view(torch.int32)[:, 2:6]  # the same bytes as another dtype
    mixed = joined([rows[1], alias])
    assert mixed.dtype == torch.float32 and mixed.data_ptr() != rows[1].data_ptr()


class ReadThrough(LayeredEntryWrapper):
    """An entry read layer by layer that is complete once every layer was read (a disk or
    Redis entry)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.read: set[int] = set()

    def layer(self, i: int):
        self.read.add(i)
        return self.inner.layer(i)

    @property
    def complete(self) -> bool:
        return len(self.read) == self.num_layers


def test_where_rows_lie_is_decided_before_the_reader_runs(engine_for):
    """A captured pass takes a feed whose rows were all read when the request started
    (``loaded``); the reader marks entries read as it goes, so a look after it ran would
    depend on its timing (the same request a replay one time, the layer loop another)."""
    engine = engine_for("llama", layers=4)
    segments = [CachedSegment(s.start, ReadThrough(s.kv))
                for s in segments_of(engine, LAYOUTS["gaps"], torch.float32)]
    n = max(s.end for s in segments)
    runner = engine.runner
    fused, rope = runner.buffer(n), runner.rope(n)
    feed = runner.feed(segments, fused, rope, depth=3)
    assert feed.pipelined and not feed.loaded and not feed.resident
    with torch.inference_mode():
        for i in range(engine.adapter.num_layers):
            feed.wait(i)
    assert all(s.kv.complete for s in segments)  # every entry read through by now
    assert not feed.loaded and not feed.resident  # as when it started
    feed.close()
