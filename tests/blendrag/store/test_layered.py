"""Layer-wise reads (store/layered.py): each tier returns the stored rows layer by layer,
reads only that layer, verifies it, and a throttled tier takes the modelled time."""

from __future__ import annotations

import errno
import threading
import time

import pytest
import torch

from blendrag.store import MemoryKVStore, layered, read_ahead, readers
from blendrag.store.codec import encode, open_entry
from blendrag.store.errors import EntryError
from blendrag.store.host_memory import pageable_buffer
from blendrag.store.layered import LayerReadError
from blendrag.store.throttle import Throttle, ThrottledTier
from helpers.kvgen import make_kv


def _check(entry, kv) -> None:
    assert (entry.token_ids, entry.prefix_hash, entry.shape) == (kv.token_ids, kv.prefix_hash,
                                                                 tuple(kv.keys.shape))
    assert torch.equal(entry.profile, kv.profile)
    for i in reversed(range(kv.num_layers)):  # any order: a layer is read on its own
        k, v = entry.layer(i)
        assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])


def test_every_tier_reads_layer_by_layer(make_store, redis_server, redis_prefix):
    kv = make_kv(1, profile=True)
    ram = MemoryKVStore()
    disk = make_store(ram_bytes=0)
    redis = make_store(ram_bytes=0, disk_dir=None, redis_url=redis_server.url,
                       redis_prefix=redis_prefix)
    for store, tier in ((ram, "ram"), (disk, "disk"), (redis, "redis")):
        store.put("k", kv)
        entry = store.open_layers("k")
        assert entry.tier == tier
        _check(entry, kv)
        entry.close()
        assert store.open_layers("absent") is None
    # the persistent tiers read each layer's bytes once, counted as they are read
    per_layer = kv.nbytes // kv.num_layers
    assert disk.stats().tier("disk").bytes_read == kv.num_layers * per_layer


def test_a_read_through_entry_is_promoted_to_ram(make_store):
    kv = make_kv(2)
    store = make_store()
    store.put("k", kv, ram=False)
    entry = store.open_layers("k")
    for i in range(kv.num_layers):
        entry.layer(i)
    entry.close()
    assert store.stats().tier("ram").entries == 1
    assert store.open_layers("k").tier == "ram"


def test_a_layer_failing_its_checksum_is_reported_and_the_entry_dropped(make_store):
    kv = make_kv(3)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    path = store.tiers[0].tier.entry_path("k")
    data = bytearray(path.read_bytes())
    with open_entry(bytes(data), "k") as reader:
        start, _ = reader.span("v.1")
    data[start] ^= 0xFF  # one bit pattern of layer 1's values
    path.write_bytes(bytes(data))
    entry = store.open_layers("k")  # the header is intact
    entry.layer(0)
    with pytest.raises(LayerReadError) as err:
        entry.layer(1)
    assert (err.value.key, err.value.layer) == ("k", 1)
    assert isinstance(err.value.__cause__, EntryError)
    entry.close()
    assert not store.contains("k") and store.stats().tier("disk").corrupt == 1


def test_throttled_reads_take_the_modelled_time(make_store):
    kv = make_kv(4, layers=4, tokens=256, dim=64)  # 256 KiB a layer
    throttle = Throttle(bandwidth_gbps=0.05, latency_us=2000)  # 2 ms + 5.2 ms a layer
    store = make_store(ram_bytes=0, disk_bytes=64 << 20,
                       wrap=lambda t: ThrottledTier(t, throttle))
    store.put("k", kv)
    layer = kv.nbytes // kv.num_layers
    assert throttle.seconds(layer) == pytest.approx(2e-3 + layer / 5e7)
    t0 = time.perf_counter()
    entry = store.open_layers("k")
    for i in range(kv.num_layers):
        entry.layer(i)
    took = time.perf_counter() - t0
    modelled = throttle.seconds(0) + kv.num_layers * throttle.seconds(layer)
    assert modelled <= took < 3 * modelled + 0.05
    entry.close()
    t0 = time.perf_counter()
    assert store.get("k") is not None  # a whole entry: one request of all its bytes
    assert time.perf_counter() - t0 >= throttle.seconds(len(encode("k", kv)))
    for bad in (dict(bandwidth_gbps=0), dict(bandwidth_gbps=1, latency_us=-1)):
        with pytest.raises(ValueError):
            Throttle(**bad)


def _layer_start(store, key: str, layer: int) -> int:
    """Where layer ``layer``'s tensors start in the entry file of ``key``."""
    path = store.tiers[0].tier.entry_path(key)
    with open_entry(path, key) as reader:
        return min(reader.span(f"{kind}.{layer}")[0] for kind in ("k", "v"))


def _fail_reads_of(store, key: str, layer: int, monkeypatch) -> None:
    """Every file read that covers the start of ``layer`` of ``key`` fails (EIO)."""
    bad = _layer_start(store, key, layer)
    real = readers.os.preadv

    def preadv(fd, buffers, offset):
        end = offset + sum(len(b) for b in buffers)
        if offset <= bad < end:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buffers, offset)

    monkeypatch.setattr(readers.os, "preadv", preadv)


@pytest.mark.parametrize("workers,tasks", [(0, 8), (2, 8), (2, 1)])
def test_a_layer_that_cannot_be_read_fails_when_it_is_asked_for(make_store, monkeypatch,
                                                               workers, tasks):
    """Read ahead or not, a failed read of layer 2 is that layer's failure (a storage one:
    nothing deleted), raised when layer 2 is asked for, after layers 0 and 1 are served; also
    when the pool reads all four layers in one task (``tasks=1``), and so fails in the middle
    of it."""
    monkeypatch.setattr(read_ahead, "READ_AHEAD_WORKERS", workers)
    monkeypatch.setattr(read_ahead, "MIN_TASKS", tasks)
    kv = make_kv(5, layers=4, tokens=64)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    _fail_reads_of(store, "k", 2, monkeypatch)
    entry = store.open_layers("k")
    for i in range(2):
        k, v = entry.layer(i)
        assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])
    with pytest.raises(LayerReadError) as err:
        entry.layer(2)
    assert isinstance(err.value.__cause__, OSError)
    entry.close()
    assert store.contains("k") and store.stats().tier("disk").errors == 1


def test_closing_an_entry_stops_its_reads_ahead_before_the_file_is_closed(make_store,
                                                                          monkeypatch):
    monkeypatch.setattr(read_ahead, "READ_AHEAD_WORKERS", 2)
    kv = make_kv(6, layers=8, tokens=64)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    first = _layer_start(store, "k", 0)
    real = readers.os.preadv
    closed = threading.Event()
    late: list[int] = []

    def slow_preadv(fd, buffers, offset):
        if offset >= first:  # a layer, not the header or the priors
            time.sleep(0.02)
            if closed.is_set():
                late.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(readers.os, "preadv", slow_preadv)
    entry = store.open_layers("k")
    entry.close()  # while the pool reads its first layers
    closed.set()
    time.sleep(0.1)
    assert late == []
    monkeypatch.undo()
    entry = store.open_layers("k")  # the entry is whole, and read ahead in full
    assert all(torch.equal(entry.layer(i)[1], kv.values[i]) for i in range(kv.num_layers))
    entry.close()


def test_pageable_buffers_are_plain_tensors():
    small, large = pageable_buffer((2, 3), torch.bfloat16), pageable_buffer((5, 1 << 20),
                                                                           torch.float32)
    assert (small.shape, small.dtype, large.shape, large.dtype) == (
        (2, 3), torch.bfloat16, (5, 1 << 20), torch.float32)
    large.fill_(1.5)  # the huge-page advice changes nothing of the memory's use
    assert large.sum().item() == 5 * (1 << 20) * 1.5 and not large.is_pinned()


def test_reads_ahead_come_a_block_of_layers_a_task():
    """An entry's layers are handed to the pool a block a task: about ``TASK_BYTES`` each, in
    at least ``MIN_TASKS`` tasks."""
    mib = 1 << 20
    assert read_ahead.task_layers(32, 2 * mib) == 4  # a 7B model's 512 tokens: 8 tasks
    assert read_ahead.task_layers(32, 6 * mib) == 1  # larger layers: one a task
    assert read_ahead.task_layers(4, 1000) == 1  # few layers: one a task
    assert read_ahead.task_layers(30, 10) == 4


def test_every_layer_read_ahead_in_blocks_is_its_own(make_store, monkeypatch):
    """Read in blocks of two layers by the pool, every layer comes back as stored, whichever
    order they are asked in, and a layer asked for before its block started is read at once."""
    monkeypatch.setattr(read_ahead, "READ_AHEAD_WORKERS", 2)
    monkeypatch.setattr(read_ahead, "MIN_TASKS", 4)
    kv = make_kv(7, layers=8, tokens=64)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    for order in (range(8), [7, 0, 3, 2, 1, 6, 5, 4]):
        entry = store.open_layers("k")
        for i in order:
            k, v = entry.layer(i)
            assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i]), i
        assert entry.complete
        entry.close()


class _HeldPool:
    """A read-ahead pool that runs nothing: what an entry hands it, recorded."""

    def __init__(self) -> None:
        self.tasks: list[tuple[int, list[int]]] = []

    def submit(self, priority, fn):
        from concurrent.futures import Future

        self.tasks.append((priority, fn.args[1]))  # partial(_read_layers, entry, layers)
        return Future()


def test_a_layer_asked_for_before_its_task_started_leaves_the_rest_to_the_pool(make_store,
                                                                               monkeypatch):
    """Asked for before its task ran, a layer is read by its caller and the task's other layers
    go back to the pool as a task of their own (not read one by one by the caller)."""
    pool = _HeldPool()
    monkeypatch.setattr(layered, "read_pool", lambda: pool)
    monkeypatch.setattr(read_ahead, "MIN_TASKS", 2)
    kv = make_kv(8, layers=8, tokens=64)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    entry = store.open_layers("k")
    assert pool.tasks == [(0, [0, 1, 2, 3]), (4, [4, 5, 6, 7])]
    k, v = entry.layer(1)
    assert torch.equal(k, kv.keys[1]) and torch.equal(v, kv.values[1])
    assert pool.tasks[-1] == (0, [0, 2, 3])
    entry.layer(2)
    assert pool.tasks[-1] == (0, [0, 3])
    for i in range(8):
        assert torch.equal(entry.layer(i)[0], kv.keys[i]), i
    # each layer asked for early read by the caller, the rest of its task handed back
    assert pool.tasks[-4:] == [(3, [3]), (5, [5, 6, 7]), (6, [6, 7]), (7, [7])]
    entry.close()


class _EagerPool:
    """A read-ahead pool that runs each task as it is handed over: a task's reads are done,
    every one, before any layer is asked for."""

    def submit(self, priority, fn):
        from concurrent.futures import Future

        done: Future = Future()
        done.set_result(fn())
        return done


def test_a_layer_failing_inside_a_task_fails_alone(make_store, monkeypatch):
    """One task reads all four layers and layer 2's read fails: layers 0, 1 and 3 are served
    from it, and only layer 2 raises (a storage failure: nothing deleted)."""
    monkeypatch.setattr(layered, "read_pool", lambda: _EagerPool())
    monkeypatch.setattr(read_ahead, "MIN_TASKS", 1)
    kv = make_kv(9, layers=4, tokens=64)
    store = make_store(ram_bytes=0)
    store.put("k", kv)
    _fail_reads_of(store, "k", 2, monkeypatch)
    entry = store.open_layers("k")
    for i in (0, 1, 3):
        k, v = entry.layer(i)
        assert torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i]), i
    with pytest.raises(LayerReadError) as err:
        entry.layer(2)
    assert isinstance(err.value.__cause__, OSError)
    entry.close()
    assert store.contains("k")
