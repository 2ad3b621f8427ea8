"""Cached rows for the layer loop, one layer at a time: read in the loop, or read ahead.

The loop asks ``feed.get(i)`` for layer i of every cached segment, in layer order, and the
feed reads them through each segment's ``kv.layer(i)`` (``store/layered.py``: views for an
entry in RAM, positioned reads for disk, GETRANGE for Redis). One reading path, two schedules:

- ``depth=0`` (sequential loading): ``get(i)`` reads layer i on the caller's thread; the
  request's time is load + compute.
- ``depth=d > 0`` (pipelined loading): a background thread starts reading layer 0 as soon as
  the feed is made and stays at most ``d`` layers ahead of the loop (a bounded queue), so layer
  i+1 is read while layer i computes: the request takes about max(load, compute). File reads,
  Redis round trips, checksums (xxhash) and the torch kernels all release the GIL.

The rows are the same tensors either way, so pipelined and sequential requests compute
identical logits (tests/blendrag/engine/test_pipelined.py). A read that fails raises its
error (``LayerReadError``) from ``get`` of that layer, on the loop's thread.

On CUDA with rows on the host, the reader also moves them to the device: each layer is copied
into a pinned staging slot, sent with a non-blocking copy on the feed's own stream, and an
event recorded after it; ``get`` makes the compute stream wait for that event (no host sync).
A staging slot is reused only after its copy's event has completed.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import torch

from blendrag.engine.fused_kv import CachedSegment

Rows = list[tuple[torch.Tensor, torch.Tensor]]  # per segment: (pre-RoPE keys, values) [Hkv, T, D]


class LayerFeed:
    """Layer i of every segment of ``segments``, for i = 0, 1, ... ``num_layers - 1``.

    After the request: ``wait_s`` is the time ``get`` spent waiting for rows (all of the load
    when sequential); ``tier_s`` and ``tier_bytes`` the time spent reading and the bytes read,
    per tier the segments came from (what the loading controller learns from)."""

    def __init__(self, segments: Sequence[CachedSegment], num_layers: int,
                 device: torch.device, depth: int = 0) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.segments = list(segments)
        self.num_layers = num_layers
        self.device = device
        self.depth = depth if self.segments else 0
        self.wait_s = 0.0
        self.tier_s: dict[str, float] = {}
        self.tier_bytes: dict[str, int] = {}
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # rows on the host go to the device from pinned buffers on a copy stream
        staged = device.type == "cuda" and self.depth > 0
        self._stager = _CudaStager(device, self.depth) if staged else None
        if self.depth:
            self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
            self._thread = threading.Thread(target=self._run, name="blendrag-layer-feed",
                                            daemon=True)
            self._thread.start()

    @property
    def pipelined(self) -> bool:
        """Whether a background reader reads ahead (depth > 0 and something to read)."""
        return self.depth > 0

    def get(self, i: int) -> Rows:
        """Layer ``i``'s rows of every segment (layers are asked for in order, once each)."""
        if i != self._next:
            raise ValueError(f"layers are read in order: asked for layer {i}, next is "
                             f"{self._next}")
        self._next += 1
        t0 = time.perf_counter()
        if self._thread is None:
            rows = self._read(i)
        else:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            rows, event = item
            if event is not None:
                _CudaStager.consume(rows, event, self.device)
        self.wait_s += time.perf_counter() - t0
        return rows

    def close(self) -> None:
        """Stop the reader (a request that failed or finished early) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:  # unblock a reader waiting on a full queue
                    self._queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self._thread = None

    def _read(self, i: int) -> Rows:
        rows = []
        for seg in self.segments:
            t0 = time.perf_counter()
            rows.append(seg.kv.layer(i))
            tier = seg.kv.tier
            self.tier_s[tier] = self.tier_s.get(tier, 0.0) + time.perf_counter() - t0
            self.tier_bytes[tier] = self.tier_bytes.get(tier, 0) + seg.kv.layer_nbytes
        return rows

    def _run(self) -> None:
        for i in range(self.num_layers):
            if self._stop.is_set():
                return
            try:
                rows = self._read(i)
                item = self._stager.send(rows) if self._stager is not None else (rows, None)
            except BaseException as exc:  # handed to the loop's thread, raised by get(i)
                self._put(exc)
                return
            if not self._put(item):
                return

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


class _CudaStager:
    """Host rows to the device through pinned buffers on a copy stream (see the module
    docstring). ``depth + 2`` staging slots: at most ``depth`` layers wait in the queue, one is
    being consumed and one is being filled."""

    def __init__(self, device: torch.device, depth: int) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._slots: list[tuple[list[torch.Tensor | None], torch.cuda.Event | None]] = [
            ([], None) for _ in range(depth + 2)]
        self._turn = 0

    def send(self, rows: Rows) -> tuple[Rows, torch.cuda.Event]:
        buffers, done = self._slots[self._turn]
        if done is not None:
            done.synchronize()  # the slot's previous copy has left the pinned buffers
        host = [t for pair in rows for t in pair]
        if [_spec(b) for b in buffers] != [_spec(t) for t in host]:
            buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                       if t.device.type == "cpu" else None for t in host]
        out = []
        with torch.cuda.stream(self.stream):
            for buf, t in zip(buffers, host):
                if buf is None:  # already on the device (e.g. a chunk computed now)
                    out.append(t)
                    continue
                buf.copy_(t)
                out.append(buf.to(self.device, non_blocking=True))
            event = torch.cuda.Event()
            event.record(self.stream)
        self._slots[self._turn] = (buffers, event)
        self._turn = (self._turn + 1) % len(self._slots)
        return [(out[2 * j], out[2 * j + 1]) for j in range(len(rows))], event

    @staticmethod
    def consume(rows: Rows, event: torch.cuda.Event, device: torch.device) -> None:
        """Make the compute stream wait for the copies, and tell the allocator the rows (made
        on the copy stream) are used on it, so their memory is not reused too early."""
        stream = torch.cuda.current_stream(device)
        stream.wait_event(event)
        for k, v in rows:
            k.record_stream(stream)
            v.record_stream(stream)


def _spec(t: torch.Tensor | None) -> tuple | None:
    """What a staging buffer must match: a host tensor's shape and dtype (None: on the device)."""
    return None if t is None or t.device.type != "cpu" else (tuple(t.shape), t.dtype)
