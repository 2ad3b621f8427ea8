"""Page-locked host memory of an exact size (kv/locked.py): its tensors, its lifetime (a block
is unmapped only after its last tensor is gone and its noted copies are done) and its refusals.
On the CPU the CUDA runtime is a fake that records the calls; the CUDA-marked tests use the
real one."""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from blendrag.kv import locked


class FakeRuntime:
    """Registration calls recorded; ``refuse``: every registration refused."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []

    def register(self, ptr: int, nbytes: int) -> bool:
        if self.refuse:
            return False
        self.registered[ptr] = nbytes
        return True

    def unregister(self, ptr: int) -> bool:
        self.unregistered.append(ptr)
        return True


class FakeEvent:
    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


@pytest.fixture
def rt():
    runtime = FakeRuntime()
    yield runtime
    gc.collect()
    locked.release()


def test_a_locked_tensor_has_the_shape_dtype_and_page_rounded_memory_asked_for(rt):
    t = locked.locked_empty((2, 3, 5, 4), torch.bfloat16, rt)
    assert t is not None and t.shape == (2, 3, 5, 4) and t.dtype == torch.bfloat16
    assert t.is_contiguous() and t.device.type == "cpu"
    ((ptr, nbytes),) = rt.registered.items()
    assert t.data_ptr() == ptr and nbytes == mmap.PAGESIZE  # 240 bytes: one page
    t.copy_(torch.arange(120, dtype=torch.bfloat16).view(2, 3, 5, 4))
    assert t.flatten().tolist() == list(range(120))
    assert locked.is_locked(t) and locked.is_locked(t[1, 2]) and locked.is_locked(t[1:, :, 3:])
    assert not locked.is_locked(torch.zeros(4)) and not locked.is_locked(t.clone())


def test_a_block_is_unmapped_only_after_its_last_view_and_its_noted_copies(rt):
    t = locked.locked_empty((64, 1024), torch.float32, rt)
    t.fill_(2.0)
    view = t[10]
    ptr = t.data_ptr()
    del t
    gc.collect()
    assert locked.release() == 0 and rt.unregistered == []  # the view holds it
    assert locked.is_locked(view) and view.sum().item() == 2048.0
    copy = FakeEvent()
    locked.note_reads([view], copy)  # a copy from the view still queued
    del view
    gc.collect()
    assert locked.release() == 1 and rt.unregistered == []  # retired, still read
    copy.done = True
    assert locked.release() == 0 and rt.unregistered == [ptr]


def test_views_the_feed_and_the_store_make_hold_the_block(rt):
    """What the RAM tier and the layer feed make of an entry's rows (a dtype view, a block of
    layers as one strided view, a ChunkKV replaced) keeps its memory mapped."""
    from dataclasses import replace

    from blendrag.engine.compute.layer_feed import joined
    from blendrag.kv.chunk_kv import ChunkKV

    pair = locked.locked_empty((2, 4, 2, 3, 8), torch.bfloat16, rt)  # [2, L, Hkv, T, D]
    pair.copy_(torch.arange(pair.numel()).view(pair.shape))
    want = pair.clone()
    kv = replace(ChunkKV(pair[0], pair[1], (1, 2, 3)), prefix_hash="p")
    block = joined([kv.keys[1], kv.keys[2]])  # one as_strided view of layers 1 and 2
    bits = kv.values.view(torch.int16)
    del pair, kv
    gc.collect()
    assert locked.release() == 0 and rt.unregistered == []
    assert torch.equal(block, want[0, 1:3]) and torch.equal(bits, want[1].view(torch.int16))
    del block, bits
    gc.collect()
    assert locked.release() == 0 and len(rt.unregistered) == 1


def test_a_block_is_released_through_the_runtime_that_registered_it():
    first, second = FakeRuntime(), FakeRuntime()
    a = locked.locked_empty((8,), torch.float32, first)
    b = locked.locked_empty((8,), torch.float32, second)
    pa, pb = a.data_ptr(), b.data_ptr()
    del a, b
    gc.collect()
    locked.release()
    assert first.unregistered == [pa] and second.unregistered == [pb]


def test_a_block_whose_unregistering_fails_stays_mapped():
    class Stuck(FakeRuntime):
        def unregister(self, ptr: int) -> bool:
            self.unregistered.append(ptr)
            return False

    stuck = Stuck()
    t = locked.locked_empty((8,), torch.float32, stuck)
    del t
    gc.collect()
    kept = len(locked.REGISTRY.kept)
    assert locked.release() == 0 and len(stuck.unregistered) == 1
    assert len(locked.REGISTRY.kept) == kept + 1 and not locked.REGISTRY.kept[-1].closed


def test_after_a_refusal_nothing_is_registered_until_memory_is_released(rt):
    class Full(FakeRuntime):
        def register(self, ptr: int, nbytes: int) -> bool:
            self.calls = getattr(self, "calls", 0) + 1
            return super().register(ptr, nbytes)

    full = Full(refuse=True)
    assert locked.locked_empty((8,), torch.float32, full) is None
    full.refuse = False
    assert locked.locked_empty((8,), torch.float32, full) is None and full.calls == 1
    t = locked.locked_empty((8,), torch.float32, rt)  # another runtime: not held back
    del t
    gc.collect()
    locked.release()  # memory given back: asked again
    assert locked.locked_empty((8,), torch.float32, full) is not None and full.calls == 2


def test_a_failure_after_registering_gives_none_and_releases_the_block(rt, monkeypatch):
    def broken(_):
        raise RuntimeError("no numpy bridge")

    monkeypatch.setattr(torch, "from_numpy", broken)
    assert locked.locked_empty((16,), torch.float32, rt) is None
    gc.collect()
    locked.release()
    assert list(rt.registered) == rt.unregistered and len(rt.unregistered) == 1


def test_noting_keeps_only_the_copies_not_done(rt):
    t = locked.locked_empty((8,), torch.float32, rt)
    events = [FakeEvent() for _ in range(3)]
    for e in events:
        locked.note_reads([t], e)
        e.done = True
    block = locked.REGISTRY.block_of(t)
    assert block is not None and block.reads == [events[-1]]  # the list does not grow


def test_a_refused_registration_gives_none_and_registers_nothing():
    refusing = FakeRuntime(refuse=True)
    live = list(locked.REGISTRY.starts)
    assert locked.locked_empty((16, 16), torch.float16, refusing) is None
    assert refusing.registered == {} and locked.REGISTRY.starts == live
    assert locked.REGISTRY.refuses(refusing)
    del refusing
    gc.collect()
    # the refusal went with its runtime: a new one, even at the same address, is asked
    assert len(locked.REGISTRY.refused) == 0


def test_nothing_to_lock_or_no_runtime_gives_none(rt, monkeypatch):
    assert locked.locked_empty((0, 4), torch.float32, rt) is None and rt.registered == {}
    monkeypatch.setattr(locked, "_runtime", [None])
    assert locked.locked_empty((4, 4), torch.float32) is None


def test_copies_to_a_cpu_or_from_unlocked_rows_note_nothing(rt):
    t = locked.locked_empty((4,), torch.float32, rt)
    locked.note_copies([t, torch.zeros(2)], torch.device("cpu"))  # no event on a CPU
    block = locked.REGISTRY.block_of(t)
    assert block is not None and block.reads == []


def test_a_chunk_on_the_host_stays_where_it_is_when_sent_to_the_cpu(rt):
    from blendrag.kv.chunk_kv import ChunkKV

    k = locked.locked_empty((1, 1, 2, 4), torch.float32, rt)
    kv = ChunkKV(k, k.clone(), (1, 2))
    assert kv.to("cpu") is kv


# ---- the real CUDA runtime ----------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_locked_memory_on_cuda_is_pinned_and_copies_both_ways():
    assert locked.runtime() is not None, "no registration: RAM tier entries stay pageable"
    src = torch.randn(8, 2, 300, 64, device="cuda", dtype=torch.bfloat16)
    host = locked.locked_empty(tuple(src.shape), src.dtype)
    assert host is not None and host.is_pinned()
    host.copy_(src)
    back = host.to("cuda", non_blocking=True)
    locked.note_copies([host], torch.device("cuda"))
    assert torch.equal(back, src)
    ptr = host.data_ptr()
    del host
    gc.collect()
    assert any(r.ptr == ptr for r in locked.REGISTRY.retired)
    torch.cuda.current_stream().synchronize()
    locked.release()
    assert all(r.ptr != ptr for r in locked.REGISTRY.retired)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_copy_in_flight_keeps_its_block_mapped():
    src = torch.randn(4 << 20, device="cuda")
    host = locked.locked_empty(tuple(src.shape), src.dtype)
    assert host is not None
    host.copy_(src)
    torch.cuda._sleep(200_000_000)  # the stream busy for a while: the copy below waits
    out = host.to("cuda", non_blocking=True)
    locked.note_copies([host], torch.device("cuda"))
    ptr = host.data_ptr()
    del host
    gc.collect()
    assert locked.release() >= 1 and any(r.ptr == ptr for r in locked.REGISTRY.retired)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(out, src)
    locked.release()
    assert all(r.ptr != ptr for r in locked.REGISTRY.retired)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_refused_registration_leaves_no_error_for_the_next_kernel():
    rt = locked.runtime()
    assert rt is not None
    host = locked.locked_empty((1024,), torch.float32)
    assert host is not None
    assert rt.register(host.data_ptr(), 4096) is False  # registered already: refused
    x = torch.ones(4, device="cuda") + 1  # torch checks the last error after each launch
    torch.cuda.current_stream().synchronize()
    assert x.sum().item() == 8.0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_chunk_sent_to_the_host_holds_its_rows_when_to_returns():
    """A copy to the host is not asynchronous: the rows are there when ``to`` returns (with
    non_blocking, torch returns pinned memory the copy has not reached yet)."""
    from blendrag.kv.chunk_kv import ChunkKV

    k = torch.randn(4, 2, 4096, 128, device="cuda")
    torch.cuda._sleep(50_000_000)  # the copy queues behind this on the stream
    host = ChunkKV(k, k * 2, tuple(range(4096))).to("cpu")
    seen = host.keys.clone(), host.values.clone()  # read now, before anything syncs
    assert torch.equal(seen[0], k.cpu()) and torch.equal(seen[1], (k * 2).cpu())
