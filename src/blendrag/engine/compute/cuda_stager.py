"""Host rows to the device for the layer feed's reader (engine/compute/layer_feed.py), on CUDA:
pinned staging buffers, non-blocking copies and the placing kernels on a stream of the
reader's own, an event after each block; the compute stream waits for that event, never the
host. The reader's stream first waits for the compute stream, which made the request's KV and
the RoPE tables; a staging slot is reused only after its copy's event has completed."""

from __future__ import annotations

from collections.abc import Callable

import torch

from blendrag.kv.locked import note_reads

# per segment: (pre-RoPE keys, values) of a block of layers: [layers, Hkv, T, D] each
Rows = list[tuple[torch.Tensor, torch.Tensor]]


class CudaStager:
    """Host rows to the device through pinned buffers on a stream of the reader's own, placed
    there too when the reader places (see the module docstring). ``depth + 2`` staging slots:
    at most ``depth`` blocks of layers wait in the queue, one is being consumed and one is being
    filled (a slot's buffers are made again when a block's shapes differ from its last one's:
    the last block of a run of layers may be shorter)."""

    def __init__(self, device: torch.device, depth: int) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        # the request's KV and RoPE tables were made on the compute stream
        self.stream.wait_stream(torch.cuda.current_stream(device))
        self._slots: list[tuple[list[torch.Tensor | None], torch.cuda.Event | None]] = [
            ([], None) for _ in range(depth + 2)]
        self._turn = 0

    def send(self, rows: Rows, place: Callable[[Rows], None] | None,
             ) -> tuple[Rows | None, torch.cuda.Event]:
        """A block's rows on the device, placed when ``place`` is given (then None is
        returned for the rows), and the event that follows the copies (and the placing)."""
        buffers, done = self._slots[self._turn]
        if done is not None and any(b is not None for b in buffers):
            done.synchronize()  # the slot's previous copy has left the pinned buffers
        host = [t for pair in rows for t in pair]
        held = [None if b is None else (tuple(b.shape), b.dtype) for b in buffers]
        if held != [_spec(t) for t in host]:
            buffers = [None if _spec(t) is None else _staging(t) for t in host]
        out, direct = [], []
        with torch.cuda.stream(self.stream):
            for buf, t in zip(buffers, host):
                if buf is None:  # on the device already (a chunk computed now), or pinned:
                    # the disk tier's reads (torch keeps its pinned block from reuse until the
                    # copy is done) or the RAM tier's locked entries (noted below)
                    if t.device.type == "cpu":
                        direct.append(t)
                    out.append(t if t.device.type != "cpu"
                               else t.to(self.device, non_blocking=True))
                    continue
                buf.copy_(t)
                out.append(buf.to(self.device, non_blocking=True))
            on_device = [(out[2 * j], out[2 * j + 1]) for j in range(len(rows))]
            if place is not None:
                place(on_device)
            event = torch.cuda.Event()
            event.record(self.stream)
        note_reads(direct, event)
        self._slots[self._turn] = (buffers, event)
        self._turn = (self._turn + 1) % len(self._slots)
        return (None if place is not None else on_device), event

    @staticmethod
    def consume(rows: Rows | None, event: torch.cuda.Event, device: torch.device) -> None:
        """Make the compute stream wait for the reader's stream up to ``event``; rows to be
        placed on the compute stream (made on the reader's) are marked as used there, so that
        their memory is not reused too early."""
        stream = torch.cuda.current_stream(device)
        stream.wait_event(event)
        for k, v in rows or ():
            k.record_stream(stream)
            v.record_stream(stream)


def _staging(t: torch.Tensor) -> torch.Tensor:
    """A staging buffer for host tensor ``t``: pinned, or pageable when no page-locked memory
    is left (a container's locked-memory limit), where a copy from it has left it when the copy
    call returns: slower, the same values, never a failed request."""
    try:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    except RuntimeError:
        return torch.empty(t.shape, dtype=t.dtype)


def _spec(t: torch.Tensor | None) -> tuple | None:
    """What a staging buffer must match: a host tensor's shape and dtype (None: no staging, on
    the device or pinned already)."""
    if t is None or t.device.type != "cpu" or t.is_pinned():
        return None
    return tuple(t.shape), t.dtype
