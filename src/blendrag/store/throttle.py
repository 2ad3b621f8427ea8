"""A storage model for benchmarks: a tier whose reads take as long as a given device's would.

``ThrottledTier`` wraps any tier of a ``TieredKVStore`` (``TieredKVStore(config,
wrap=...)``) and makes every read last at least ``latency + bytes / bandwidth``: a whole entry
(``read``), the header of a layered entry (``open_layers``: one latency) and each layer
(``layer(i)``: one latency + the layer's bytes). It sleeps the difference between that and the
time the real read took, so the modelled device is never faster than the real one underneath.
``time.sleep`` releases the GIL: a throttled read overlaps the model's compute as real I/O
does, which is what the pipelined-loading benchmark measures (NVMe ~3 GB/s, a network tier
~1 GB/s with ~100 us per request, on a machine that has neither).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from blendrag.checks import check_at_least
from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import Entry
from blendrag.store.layered import LayeredEntry
from blendrag.store.tier import Tier
from blendrag.store.wrappers import LayeredEntryWrapper, TierWrapper


@dataclass(frozen=True)
class Throttle:
    """bandwidth_gbps: GB/s (1e9 bytes) of the modelled device; latency_us: per request."""

    bandwidth_gbps: float
    latency_us: float = 0.0

    def __post_init__(self) -> None:
        for name in ("bandwidth_gbps", "latency_us"):
            check_at_least(f"Throttle.{name}", getattr(self, name))
        if self.bandwidth_gbps == 0:
            raise ValueError("Throttle.bandwidth_gbps must be > 0")

    def seconds(self, nbytes: int) -> float:
        """How long reading ``nbytes`` in one request takes on the modelled device."""
        return self.latency_us * 1e-6 + nbytes / (self.bandwidth_gbps * 1e9)

    def wait(self, nbytes: int, since: float) -> None:
        """Sleep until ``seconds(nbytes)`` have passed since ``since`` (a perf_counter)."""
        left = self.seconds(nbytes) - (time.perf_counter() - since)
        if left > 0:
            time.sleep(left)


class ThrottledTier(TierWrapper):
    """``tier`` read at the speed of ``throttle``; writes are not slowed. Everything but the two
    reads (``read``, ``open_layers``) is the wrapped tier's own (``TierWrapper``)."""

    def __init__(self, tier: Tier, throttle: Throttle) -> None:
        super().__init__(tier)
        self.throttle = throttle

    def read(self, key: str) -> tuple[Entry, int] | None:
        t0 = time.perf_counter()
        found = self.inner.read(key)
        self.throttle.wait(found[1] if found is not None else 0, t0)
        return found

    def open_layers(self, key: str) -> LayeredEntry | None:
        t0 = time.perf_counter()
        entry = self.inner.open_layers(key)
        self.throttle.wait(0, t0)  # the header: one request
        return None if entry is None else ThrottledLayers(entry, self.throttle)


class ThrottledLayers(LayeredEntryWrapper):
    """A layered entry whose first read of each layer lasts at least one throttled request."""

    def __init__(self, entry: LayeredEntry, throttle: Throttle) -> None:
        super().__init__(entry)
        self.throttle = throttle
        self._done: set[int] = set()

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        rows = self.inner.layer(i)
        if i not in self._done:
            self._done.add(i)
            self.throttle.wait(self.inner.stored_layer_nbytes, t0)
        return rows

    def materialize(self) -> ChunkKV:
        for i in range(self.num_layers):
            self.layer(i)
        return self.inner.materialize()
