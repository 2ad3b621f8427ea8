"""What ``TieredKVStore.open_layers`` hands out: a tier's layered entry whose reads its slot
counts, whose failures its slot deals with, and which is promoted to the faster tiers when read
through."""

from __future__ import annotations

import threading
import time

import torch

from blendrag.kv.chunk_kv import ChunkKV
from blendrag.store.codec import Entry
from blendrag.store.errors import EntryError
from blendrag.store.layered import LayeredEntry, LayerReadError, MemoryLayeredEntry
from blendrag.store.slot import TierSlot
from blendrag.store.wrappers import LayeredEntryWrapper


class CountedLayeredEntry(LayeredEntryWrapper):
    """A tier's layered entry as the store hands it out: each layer read is counted in the
    tier's stats, a failing one turns into ``LayerReadError`` after the store has dealt with
    it (an entry whose stored bytes fail a check deleted from the tier, a storage failure
    counted against the tier), and a fully read entry is copied into the faster tiers on
    ``close``."""

    def __init__(self, slot: TierSlot, faster: list[TierSlot], entry: LayeredEntry,
                 key: str | None = None) -> None:
        """``key``: the content key the caller asked for, when the tiers store the entry under
        another name (a namespace, keyed names): what ``key`` and ``LayerReadError`` say."""
        super().__init__(entry)
        self.slot, self.faster = slot, faster
        self._counted: set[int] = set()
        self._lock = threading.Lock()  # the loop's thread and the feed's reader may both read
        if key is not None:
            self.key = key

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        slot, key = self.slot, self.inner.key
        if i not in self._counted and not slot.health.available:
            # benched since the entry was opened: fail now rather than pay the tier's timeout
            # once per entry of the request (a layer read already is held: served)
            raise LayerReadError(self.key, i, f"{slot.tier.label} is benched")
        t0 = time.perf_counter()
        try:
            rows = self.inner.layer(i)
        except EntryError as exc:
            slot.counters.add(load_seconds=time.perf_counter() - t0)
            slot.judge(key, exc)  # deleted only when a fresh read fails a check too
            raise LayerReadError(self.key, i, exc) from exc
        except slot.tier.errors as exc:
            slot.failed(f"read layer {i} of entry {key[:16]}", exc)
            raise LayerReadError(self.key, i, exc) from exc
        slot.health.succeeded()
        with self._lock:
            first = i not in self._counted
            self._counted.add(i)
        if first and not isinstance(self.inner, MemoryLayeredEntry):
            slot.counters.add(bytes_read=self.inner.stored_layer_nbytes,
                              load_seconds=time.perf_counter() - t0)
        return rows

    def materialize(self) -> ChunkKV:
        if isinstance(self.inner, MemoryLayeredEntry):  # views: nothing to read or count
            return self.inner.materialize()
        for i in range(self.inner.num_layers):
            self.layer(i)  # counted, failures handled
        return self.inner.materialize()

    def close(self) -> None:
        entry = self.inner
        if self.faster and entry.complete:
            # rows stored exactly (a prefix, an exact prefix-cache block) stay exact when copied
            promoted = Entry(entry.key, entry.materialize(), exact=entry.exact)
            for faster in self.faster:
                faster.write(promoted)
        entry.close()
