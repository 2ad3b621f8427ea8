"""Cached rows for the layer loop, placed into the request's KV a layer (or every layer) at a
time: read and placed in the loop, or ahead of it.

The loop calls ``feed.wait(i)`` before layer i; when it returns, layer i's cached rows of every
segment are in the request's KV, values copied and keys rotated to their positions in this
request (``FusedKV.place``). The rows are read through each segment's ``kv.layer(i)``
(``store/layered.py``: views for an entry in RAM, positioned reads for disk, GETRANGE for
Redis, ranged GETs for S3), and placed a block of layers at a time:

- every entry read already and its rows where the request's KV is (the RAM tier on a CPU, the
  device tier, a chunk computed by this request, history rows): nothing is left to read, so
  the rows of every layer are placed at once, one copy per segment and one rotation per run
  of adjacent segments for all the layers (``entry.materialize()``: [L, Hkv, T, D]; the
  rotation a block of layers at a time past ``rope.SCRATCH_BYTES``), a block per run of
  layers that share a RoPE table (Gemma 3: its local and global layers).
  Layer by layer that is a few kernels per segment and per layer, on a GPU a large share of
  a cached request's launches;
- otherwise a block of a few layers at a time, read (or sent) while the loop computes the
  layers before it: host rows for a GPU, read already, in copies of about ``HOST_COPY_BYTES``
  of the largest segment's keys; rows still to be read (disk, Redis, S3) in blocks of that
  size too but at least ``MIN_BLOCKS`` of them (``block_layers``: the loop waits for the first
  block's reads), each segment's layers of a block taken as one view of the rows they lie in
  (``joined``; stacked only when they lie apart), so a block costs the ops of one layer: one
  copy each of keys and values per segment and one rotation per run of segments. The reader's
  ops are what the loop's thread competes with for the interpreter: layer by layer, with both
  threads bound by the host (a 7B model's short prompts on a GPU, a small model on a CPU),
  pipelined loading was slower than sequential loading.

One reading path, two schedules:

- ``depth=0`` (sequential loading): ``wait(i)`` reads and places layer i on the caller's
  thread; the request's time is load + compute.
- ``depth=d > 0`` (pipelined loading): unless every row is resident (read and on the request
  KV's device: nothing to load, placed at the first wait as with ``depth=0``), a background
  thread starts as soon as the feed is made,
  reads and places each block and stays at most ``d`` blocks ahead of the loop (a bounded
  queue), so block b+1 is read, copied and rotated while block b computes: the request takes
  about max(load, compute), and the loop's own thread runs none of the loading (on a GPU, none
  of its kernel launches). File reads, Redis round trips, checksums (xxhash) and the torch
  kernels all release the GIL. ``place_ahead=False`` keeps the reading ahead but places the
  rows in ``wait``, on the loop's thread: a timed request (``PhaseClock``) charges the copy
  and the rotation to their own phases.

The rows and the arithmetic are the same either way (per element, the same operations on the
same operands whatever the block), so pipelined and sequential requests, a layer or every
layer at a time, compute identical logits (tests/blendrag/engine/test_pipelined.py,
test_placing.py). A read that fails raises its error (``LayerReadError``) from ``wait`` of
that layer (of the first layer of its block), on the loop's thread.

On CUDA the reader works on a stream of its own (``CudaStager``, engine/compute/cuda_stager.py):
host rows go through pinned staging buffers with non-blocking copies, are placed by kernels on
that stream, and ``wait`` makes the compute stream wait for the block's event (no host sync).

A request's small host inputs take the same road (``to_device``, ``tensor_on``: its token ids,
the selection's stored priors): on CUDA a blocking copy from pageable memory makes the host wait
for every kernel queued on the stream (torch synchronizes after it), so an input made while a
pass runs would stall the queueing of the next one; pinned and non-blocking, it does not.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from functools import partial

import torch

from blendrag.engine.compute.cuda_stager import CudaStager, Rows
from blendrag.engine.compute.fused_kv import CachedSegment, FusedKV
from blendrag.engine.compute.observers import OFF, PhaseClock
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.kv.locked import note_copies
from blendrag.model.rope import RopeTables

HOST_COPY_BYTES = 4 << 20  # one copy of host rows to the device (K or V of one segment)
MIN_BLOCKS = 8  # blocks of layers a request's rows come in, at least: the loop starts early


class LayerFeed:
    """Layer i of every segment of ``segments`` placed into ``fused`` (keys rotated with
    ``rope``), for i = 0, 1, ... ``num_layers - 1``.

    After the request: ``wait_s`` is the time ``wait`` spent (all of the load when sequential);
    ``tier_s`` and ``tier_bytes`` the time spent reading and the bytes read, per tier the
    segments came from; ``place_s`` the time spent placing rows (copies and rotations), on
    whichever thread placed them: what the loading controller learns from."""

    def __init__(self, segments: Sequence[CachedSegment], num_layers: int, fused: FusedKV,
                 rope: RopeTables, depth: int = 0, place_ahead: bool = True) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self.segments = list(segments)
        self.num_layers = num_layers
        self.fused, self.rope = fused, rope
        self.device = fused.k.device
        # Where the rows lie as the request starts, before a reader runs (it marks layers read
        # as it goes, so a later look would depend on its timing: the same request would take
        # a captured pass one time and the layer loop another).
        # resident: every segment read already and on the request KV's device (the device
        # tier, chunks computed now, the RAM tier on a CPU): nothing is left to read, and every
        # layer is placed at once.
        # loaded: every segment read already and on that device or, for a GPU, in page-locked
        # host memory (the RAM tier's locked entries): what is left to copy is DMA, no work of
        # the host's; a captured pass (engine/compute/static_pass.py) waits for all and replays.
        self.resident = self._all_read(_on)
        self.loaded = self.resident or self._all_read(_placeable)
        # rows on the request KV's device already are placed at the first wait, on the loop's
        # thread: a reader would overlap nothing (the first layer waits for every row) and add
        # its start and hand-off, and on a GPU its launches' turns at the GIL
        self.depth = depth if self.segments and not self.resident else 0
        self.place_ahead = place_ahead and self.depth > 0
        self.wait_s = 0.0
        self.place_s = 0.0
        self.tier_s: dict[str, float] = {}
        self.tier_bytes: dict[str, int] = {}
        self._next = 0
        self._ready = 0  # layers [0, _ready) were waited for (a block covers several)
        # every entry's K and V, [L, Hkv, T, D], when all were read already (decided at the
        # first read, on the thread that reads); ``_whole``: placed every layer at once
        self._opened = False
        self._stacked: list[ChunkKV] | None = None
        self._whole = False
        # a block of host rows read already (the RAM tier for a GPU), and of rows still to read
        self._host_layers = copy_layers(self.segments)
        self._block_layers = block_layers(self.segments, num_layers)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # on CUDA the reader copies and places on a stream of its own
        staged = self.device.type == "cuda" and self.depth > 0
        self._stager = CudaStager(self.device, self.depth) if staged else None
        if self.depth:
            self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
            self._thread = threading.Thread(target=self._run, name="blendrag-layer-feed",
                                            daemon=True)
            self._thread.start()

    def _all_read(self, lies_right) -> bool:
        """Every segment read already, its rows where ``lies_right(kv, device)`` says."""
        return all(seg.kv.complete and lies_right(seg.kv.materialize(), self.device)
                   for seg in self.segments)

    @property
    def pipelined(self) -> bool:
        """Whether a background reader reads ahead (depth > 0 and something to read)."""
        return self.depth > 0

    def wait(self, i: int, clock: PhaseClock = OFF) -> None:
        """Return once layer ``i``'s cached rows are in the request's KV (layers are asked for
        in order, once each). ``clock``: charges the copy ("load") and the rotation ("rotate")
        when they run here."""
        if i != self._next:
            raise ValueError(f"layers are read in order: asked for layer {i}, next is "
                             f"{self._next}")
        self._next += 1
        if i < self._ready:  # placed with an earlier layer's block
            return
        t0 = time.perf_counter()
        if self._thread is None:
            end, rows = self._read(i)
            self._place(i, end, rows, clock)
        else:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            end, ahead, event = item
            if event is not None:
                CudaStager.consume(ahead, event, self.device)
            if ahead is not None:  # read ahead, placed here
                self._place(i, end, ahead, clock)
        self._ready = end
        self.wait_s += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the reader (a request that failed or finished early) and wait for it; on CUDA
        the compute stream then waits for whatever the reader's stream still runs, so that the
        request's KV is not reused under it."""
        self._stop.set()
        if self._thread is not None:
            while True:  # unblock a reader waiting on a full queue: it stops at its next step
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            self._thread.join()  # no polling: a reader still running costs no timeout here
            self._thread = None
        if self._stager is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stager.stream)

    def _read(self, i: int) -> tuple[int, Rows]:
        """The next block of layers, [i, end), and its rows of every segment."""
        if not self._opened:
            self._open()
        if self._stacked is not None:
            end = self._block_end(i) if self._whole else self._read_end(i, self._host_layers)
            return end, [(kv.keys[i:end], kv.values[i:end]) for kv in self._stacked]
        end, rows = self._read_end(i, self._block_layers), []
        for seg in self.segments:
            t0 = time.perf_counter()
            layers = [seg.kv.layer(j) for j in range(i, end)]  # [Hkv, T, D] each
            self._count(seg, t0, end - i)
            rows.append((joined([k for k, _ in layers]), joined([v for _, v in layers])))
        return end, rows

    def _open(self) -> None:
        """At the first read: whether every entry was read already (then its rows are taken
        whole, at no cost) and whether they lie on the request KV's device (then every layer
        is placed at once; host rows for a GPU go a block at a time, in copies of about
        ``HOST_COPY_BYTES``, through the staging buffers when pipelined)."""
        self._opened = True
        if not all(seg.kv.complete for seg in self.segments):
            return
        stacked = []
        for seg in self.segments:
            t0 = time.perf_counter()
            stacked.append(seg.kv.materialize())  # every layer read and verified already
            self._count(seg, t0, seg.kv.num_layers)
        self._stacked = stacked
        self._whole = all(_on(kv, self.device) for kv in stacked)

    def _count(self, seg: CachedSegment, t0: float, layers: int) -> None:
        tier = seg.kv.tier
        self.tier_s[tier] = self.tier_s.get(tier, 0.0) + time.perf_counter() - t0
        self.tier_bytes[tier] = self.tier_bytes.get(tier, 0) + layers * seg.kv.layer_nbytes

    def _read_end(self, i: int, layers: int) -> int:
        """The end of the block of ``layers`` layers from ``i`` (rows still to be read, or host
        rows to be sent: the RAM tier for a GPU), within one RoPE table's run."""
        return min(self._block_end(i), i + layers)

    def _block_end(self, i: int) -> int:
        """The end of the run of layers from ``i`` that rotate with layer i's RoPE table."""
        table, end = self.rope.layer(i), i + 1
        while end < self.num_layers and self.rope.layer(end) is table:
            end += 1
        return end

    def _place(self, i: int, end: int, rows: Rows, clock: PhaseClock = OFF) -> None:
        t0 = time.perf_counter()
        if self.device.type == "cuda":  # host rows: asynchronous copies where they are pinned
            host = [t for pair in rows for t in pair]
            rows = [(k.to(self.device, non_blocking=True), v.to(self.device, non_blocking=True))
                    for k, v in rows]
            note_copies(host, self.device)
        self.fused.place(slice(i, end), self.segments, rows, self.rope.layer(i), clock)
        self.place_s += time.perf_counter() - t0

    def _run(self) -> None:
        with torch.inference_mode():  # the request's KV is an inference tensor
            i = 0
            while i < self.num_layers:
                if self._stop.is_set():
                    return
                item: tuple[int, Rows | None, torch.cuda.Event | None]
                try:
                    end, rows = self._read(i)
                    place = partial(self._place, i, end) if self.place_ahead else None
                    if self._stager is not None:
                        item = (end, *self._stager.send(rows, place))
                    elif place is not None:
                        place(rows)
                        item = (end, None, None)
                    else:
                        item = (end, rows, None)
                except BaseException as exc:  # handed to the loop's thread, raised by wait(i)
                    self._put(exc)
                    return
                if not self._put(item):
                    return
                i = end

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False


def copy_layers(segments: Sequence[CachedSegment]) -> int:
    """Layers whose keys of the largest segment make about ``HOST_COPY_BYTES``: a block of host
    rows sent to the device (large copies run at the link's rate; the loop starts after the
    first block and computes while the next are sent)."""
    largest = max((seg.kv.layer_nbytes // 2 for seg in segments), default=1)
    return max(1, HOST_COPY_BYTES // max(1, largest))


def block_layers(segments: Sequence[CachedSegment], num_layers: int) -> int:
    """Layers a block of rows still to be read holds: ``copy_layers`` (a block costs the ops of
    one layer), in at least ``MIN_BLOCKS`` blocks (the loop starts once the first is read and
    placed, and computes while the next are read)."""
    return max(1, min(copy_layers(segments), -(-num_layers // MIN_BLOCKS)))


def joined(layers: list[torch.Tensor]) -> torch.Tensor:
    """Consecutive layers' rows, each [Hkv, T, D], as one [B, Hkv, T, D] tensor: a view when
    they lie at one stride from each other in one buffer (an entry's stacked rows, a slice of
    a request KV's rows: nothing is copied), else stacked."""
    first = layers[0]
    if len(layers) == 1:
        return first[None]
    size = first.element_size()
    gap = layers[1].data_ptr() - first.data_ptr()
    base = first.untyped_storage().data_ptr()
    if gap > 0 and gap % size == 0 and all(
            t.dtype == first.dtype and t.shape == first.shape and t.stride() == first.stride()
            and t.untyped_storage().data_ptr() == base
            and t.data_ptr() == first.data_ptr() + j * gap
            for j, t in enumerate(layers)):
        return first.as_strided((len(layers), *first.shape), (gap // size, *first.stride()))
    return torch.stack(layers)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without the host waiting for the device's queued work: on CUDA a host
    tensor is pinned and copied non-blocking (torch keeps the pinned block from reuse until
    the copy is done); elsewhere a plain ``to``. A tensor pinned already is copied as it is:
    the caller must not write it until the copy is done (callers pass tensors made for it).
    With no page-locked memory to be had (a container's locked-memory limit), a plain copy:
    the same values, only with the wait."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    held = pinned(t)
    if held is t and not t.is_pinned():  # none to be had: the plain copy
        return t.to(device)
    return held.to(device, non_blocking=True)


def pinned(t: torch.Tensor) -> torch.Tensor:
    """Host tensor ``t`` in page-locked memory (``t`` itself when it is), or ``t`` when none can
    be had: a non-blocking copy from it to a CUDA device does not make the host wait."""
    if t.is_pinned():
        return t
    try:
        return t.pin_memory()
    except RuntimeError:
        return t


def tensor_on(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` (token ids, positions) as a long tensor on ``device``, sent as ``to_device``
    sends: ``torch.tensor(values, device="cuda")`` would wait for the stream's queued work."""
    return to_device(torch.tensor(values, dtype=torch.long), device)


def _on(kv: ChunkKV, device: torch.device) -> bool:
    return kv.keys.device == device and kv.values.device == device


def _placeable(kv: ChunkKV, device: torch.device) -> bool:
    """On ``device``, or page-locked host rows for a CUDA ``device`` (sent by DMA)."""
    return _on(kv, device) or (device.type == "cuda" and kv.keys.is_pinned()
                               and kv.values.is_pinned())
