"""The KV slab's slots as a scheduler lends them (engine/compute/slab.py holds the rows).

A request is given a slot at admission when its prompt and answer fit one, prefilled as alone,
then its rows move into the slot (``place``), where it decodes with the slab's other requests
in one step. At its end the slot goes back (``release``), and whoever still holds the
request's ``Prefill`` reads no row of it any more. The slab itself is made at the first
request that wants a slot, and asked of the runner again whenever no slot is lent (the runner
lets an idle slab go at ``release_buffers``); when the device cannot give its memory, every
request decodes over a buffer of its own from then on (a warning, never a failed request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from blendrag.engine.compute.fused_kv import FusedKV
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.slab import KVSlab
from blendrag.serving.jobs import Job

log = logging.getLogger(__name__)


class SlabSlots:
    """Lends the slots of one slab of ``seqs`` slots of ``slot_rows`` rows over ``runner``'s
    model (``slot_rows`` 0: no slab, every request in its own buffer)."""

    def __init__(self, runner: Callable[[], ModelRunner], seqs: int, slot_rows: int) -> None:
        self._runner = runner
        self._seqs, self._rows = seqs, slot_rows
        self.slab: KVSlab | None = None  # the runner's, asked for while no slot is lent
        self._off = slot_rows == 0  # no slab asked for, or its memory could not be had

    def claim(self, rows: int) -> int | None:
        """A slot for a request KV of ``rows`` rows; None: it takes a buffer of its own (no
        slab, or longer than a slot)."""
        if self._off:
            return None
        runner = self._runner()
        for _ in range(2):  # again once if the runner retired the slab in between
            # asked again while no slot is lent: the runner drops a slab nobody holds a slot
            # of (``release_buffers``), and its batched step knows only the slab it has now
            if self.slab is None or not self.slab.lent:
                try:
                    self.slab = runner.slab(self._seqs, self._rows)
                # serve without one rather than fail (a CPU's failed allocation is a plain
                # RuntimeError, a GPU's torch.OutOfMemoryError, a subclass of it)
                except RuntimeError as exc:
                    log.warning("no KV slab of %d x %d rows (%s): every request decodes over "
                                "its own buffer; lower ServingConfig.slot_tokens or max_seqs",
                                self._seqs, self._rows, exc)
                    self._off = True
                    return None
            slab = self.slab
            if slab is None or not slab.fits(runner.rows_for(rows)):
                return None
            slot = slab.claim()
            if slot is not None or not slab.retired:
                return slot
        return None

    def place(self, job: Job, fused: FusedKV) -> None:
        """Move ``job``'s prefilled rows (``fused``) into its slot, where it decodes; a KV
        larger than its admission counted gives the slot back and decodes in its own buffer."""
        if self.slab is None or job.slot is None:
            return
        if self.slab.fits(fused.capacity):
            fused.move_to(self.slab.view(job.slot, fused.capacity))
        else:
            self.slab.release(job.slot)
            job.slot = None

    def decodes_in_slab(self, job: Job) -> bool:
        """Whether ``job`` decodes in the slab's step: it holds a slot and its request KV
        takes plain attention (not APE's scaled one, engine/selection/ape.py), as that step
        does."""
        return (self.slab is not None and job.slot is not None and job.stream is not None
                and job.stream.prefill.fused.ape is None)

    def release(self, job: Job) -> None:
        """Give ``job``'s slot back; whoever holds its ``Prefill`` reads no row of it."""
        if job.slot is None or self.slab is None:
            return
        pre = job.handle.prefill
        if pre is not None and self.slab.holds(pre.fused, job.slot):
            pre.fused.forget()
        self.slab.release(job.slot)
        job.slot = None
