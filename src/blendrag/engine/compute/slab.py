"""The KV slab: the request KVs of served requests, side by side in one tensor.

Requests served at once (blendrag.serving) decode their next tokens in one batched step. When
each request's rows live in a buffer of its own, that step attends once per request and layer
(engine/compute/batch_decode.py): on a GPU, 16 requests of a 32-layer model launch 512
attention calls a step, and no step of varying buffers can be captured as a graph. The slab
holds every served request's KV as one *slot* of one tensor pair
``k, v: [slots + 1, layers, kv_heads, rows, head_dim]``, so the step attends over
``k[:B, layer]`` for all of them in one call per layer and its shapes repeat (its graphs:
engine/compute/slab_step.py).

A slot is lent to one request from its admission to its last token (``claim``/``release``).
The request is prefilled as it would be alone (in the pooled buffer, where the static passes
replay), and its rows then move into its slot (``FusedKV.move_to``: one copy of the prompt's
rows), where it decodes. The last slot is scratch: the batched step's padding rows write
their keys there, never into a slot a request holds.

Rows a kernel reads are finite: a slot is zeroed before anything reads it (when it is first
lent or first read by a step), and every row written after that is a key or value the model
computed. A slot lent again still holds its last request's rows, perhaps another tenant's:
the rows past the new request's length up to where earlier requests wrote are zeroed when its
rows move in (``FusedKV.drop_earlier_rows``, as for the pooled buffer), and the step's mask
never shows a request another's rows (each batch row attends over its own slot only).
"""

from __future__ import annotations

import heapq
import threading

import torch

from blendrag.engine.compute.fused_kv import Extent, FusedKV


class KVSlab:
    """``slots`` request KVs of ``rows`` rows each, for a model of ``layers`` layers and
    ``kv_heads`` KV heads of ``head_dim``."""

    def __init__(self, slots: int, rows: int, layers: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        if slots < 1 or rows < 1:
            raise ValueError(f"a KV slab needs >= 1 slot of >= 1 row, got {slots} x {rows}")
        self.slots, self.rows = slots, rows
        # [slots + 1, layers, Hkv, rows, D]: not zeroed here (on a CPU zeros would touch every
        # page of slots no request may ever take); each slot is zeroed before it is read
        self.k = torch.empty(slots + 1, layers, kv_heads, rows, head_dim, dtype=dtype,
                             device=device)
        self.v = torch.empty_like(self.k)
        self._clean = [False] * (slots + 1)
        self._written = [Extent(0) for _ in range(slots)]
        self._free = list(range(slots))  # a heap: the lowest free slot is lent first
        self._lock = threading.Lock()
        self.retired = False  # its runner dropped it (``retire``): it lends no slot again

    @property
    def scratch(self) -> int:
        """The slot the batched step's padding rows write to."""
        return self.slots

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def holds(self, fused: FusedKV, slot: int) -> bool:
        """Whether ``fused`` is a view of ``slot`` (a request KV moved in)."""
        return 0 <= slot < self.slots and fused.base[0].data_ptr() == self.k[slot].data_ptr()

    @property
    def lent(self) -> bool:
        """Whether any slot is lent."""
        return len(self._free) < self.slots

    def fits(self, capacity: int) -> bool:
        """Whether a request KV of ``capacity`` rows fits one slot."""
        return capacity <= self.rows

    def claim(self) -> int | None:
        """Lend the lowest free slot (zeroed on its first loan) -> its index; None: none free,
        or the slab is retired.
        The lowest, so that the requests decoding together hold the first slots and the step's
        batch (every slot up to the highest lent) stays short."""
        with self._lock:
            if not self._free or self.retired:
                return None
            slot = heapq.heappop(self._free)
        self.zero([slot])
        return slot

    def retire(self) -> bool:
        """Lend no slot again, if none is lent now (checked and set at once, so that no claim
        slips in between); whether it is retired (its runner then lets it go)."""
        with self._lock:
            if self.lent:
                return False
            self.retired = True
            return True

    def release(self, slot: int) -> None:
        """Take back ``slot`` (its request is done: nothing reads its rows any more)."""
        with self._lock:
            if not 0 <= slot < self.slots or slot in self._free:
                raise ValueError(f"slot {slot} is not lent (a slab of {self.slots} slots)")
            heapq.heappush(self._free, slot)

    def view(self, slot: int, capacity: int) -> FusedKV:
        """A request KV of ``capacity`` rows over ``slot`` (``FusedKV.move_to`` moves a request's
        rows in); its base is the whole slot."""
        if not self.fits(capacity):
            raise ValueError(f"a request KV of {capacity} rows does not fit a slot of "
                             f"{self.rows}")
        k, v = self.k[slot], self.v[slot]  # [layers, Hkv, rows, D]
        fused = FusedKV.over(k[:, :, :capacity], v[:, :, :capacity], (k, v))
        written = self._written[slot]
        written.rows = max(written.rows, capacity)
        fused.track(written)
        return fused

    def zero(self, slots: list[int]) -> None:
        """Zero those of ``slots`` never zeroed yet (the step reads every slot it covers)."""
        with self._lock:
            fresh = [s for s in slots if not self._clean[s]]
            for s in fresh:
                self._clean[s] = True
        for s in fresh:
            self.k[s].zero_()
            self.v[s].zero_()

