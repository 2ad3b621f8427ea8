"""The host-device link, beside the loading phase's rates: what one copy of a prompt's cached
rows to the device takes from page-locked memory (the ceiling that the layer feed's rate from
the RAM tier is held against) and from pageable memory, and what the RAM tier pays to keep a
computed chunk page-locked (kv/locked.py: a mapping registered with CUDA, then the copy from
the device) against a plain copy to pageable memory."""

from __future__ import annotations

from collections.abc import Callable

import torch

from blendrag.kv.locked import is_locked, locked_empty
from blendrag_bench.gpu.shapes import sync
from blendrag_bench.timing import median_time

BLOCK_BYTES = 4 << 20  # the layer feed's copies of host rows (layer_feed.HOST_COPY_BYTES)


def run(emit: Callable[[str], None], nbytes: int, entry_bytes: int,
        held: torch.Tensor | None) -> dict[str, tuple[float, str, None]]:
    """Rates for ``nbytes`` (a prompt's rows) and the cost of keeping one entry of
    ``entry_bytes`` page-locked; ``held``: a row tensor the RAM tier holds, to say whether it
    is locked."""
    if not torch.cuda.is_available():
        emit("link: no CUDA device")
        return {}
    out: dict[str, tuple[float, str, None]] = {}
    if held is not None:
        emit(f"RAM tier rows page-locked (kv/locked.py): {is_locked(held)}")
    dev = torch.device("cuda")
    rows = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev)
    locked = locked_empty(tuple(rows.shape), rows.dtype)
    pageable = torch.empty_like(rows, device="cpu")
    for label, host in (("page-locked", locked), ("pageable", pageable)):
        if host is None:
            emit(f"{label}: none to be had")
            continue
        host.copy_(rows)
        for copies, size in (("one copy", nbytes), ("4 MiB copies", BLOCK_BYTES)):
            n = size // 2

            def send(host=host, n=n) -> None:
                for s in range(0, host.numel(), n):
                    rows[s:s + n].copy_(host[s:s + n], non_blocking=True)

            s = median_time(send, 4, skip=1, sync=sync).seconds
            rate = nbytes / s / 1e9
            emit(f"host -> device, {label}, {copies}: {nbytes / 2**20:.0f} MiB in "
                 f"{s * 1e3:.1f} ms = {rate:.1f} GB/s")
            out[f"host -> device, {label}, {copies} (GB/s)"] = (rate, "", None)
    del locked, pageable
    chunk = torch.empty(entry_bytes // 2, dtype=torch.bfloat16, device=dev)

    def keep_locked() -> None:
        t = locked_empty(tuple(chunk.shape), chunk.dtype)
        if t is not None:
            t.copy_(chunk)

    for label, keep in (("page-locked (map, register, copy)", keep_locked),
                        ("pageable (copy)", lambda: chunk.to("cpu"))):
        s = median_time(keep, 4, skip=1, sync=sync).seconds
        emit(f"RAM tier put of one {entry_bytes / 2**20:.0f} MiB entry, {label}: "
             f"{s * 1e3:.1f} ms")
        out[f"RAM tier put, {label} (ms)"] = (s * 1e3, "", None)
    return out
