"""The scheduler's running requests: each one's start once prefilled (its first token handed
out, its rows moved into its slab slot), the batched decoding steps that give them their next
tokens, and the end of each (its result or error handed out, its slot and pool blocks freed
first, so that whoever sees a request end sees them free).

Only the decoding loop's thread steps them; a prefill worker starts a request (``start``) and
hands it over to that thread, which adds it (``jobs``) before its next step.
"""

from __future__ import annotations

from collections.abc import Callable

from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.slab import KVSlab
from blendrag.serving import prefills, step
from blendrag.serving.jobs import Job, SchedulerStats
from blendrag.serving.pool import BlockPool
from blendrag.serving.slots import SlabSlots
from blendrag.serving.step import StreamStep


class RunningRequests:
    """The requests decoding on ``runner``'s model, their KVs in ``slots`` and their blocks
    counted in ``pool``; ``stats`` counts the steps."""

    def __init__(self, runner: Callable[[], ModelRunner], pool: BlockPool, slots: SlabSlots,
                 stats: SchedulerStats) -> None:
        self._runner, self.pool, self.slots, self.stats = runner, pool, slots, stats
        self.jobs: list[Job] = []  # the decoding loop's own

    def start(self, job: Job, outcome: prefills.Outcome) -> bool:
        """Take ``job``'s prefill (its stream, or its error) and hand out its first token;
        whether it goes on decoding (the caller then adds it to ``jobs``)."""
        try:
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome.prefill.stats.compute.packed_requests > 1:
                self.stats.packed += 1
            self.slots.place(job, outcome.prefill.fused)  # decoded in its slot, if it has one
            job.handle.prefill = outcome.prefill
            if job.prepare is not None:
                job.prepare(outcome.prefill)
            job.stream = outcome
            return not self.deliver(job, outcome.start())
        except Exception as exc:  # this request's error, never another's
            self.free([job])  # first: whoever sees the error sees its slot and blocks free
            job.handle.fail(exc)
            return False

    def step(self) -> bool:
        """One batched decoding step over the running requests; whether there was one."""
        jobs = [j for j in self.jobs if j.stream is not None and j.stream.pending is not None]
        if not jobs:
            return False
        in_slab = [j for j in jobs if self.slots.decodes_in_slab(j)]
        self._step_together(in_slab, self.slots.slab)
        self._step_together([j for j in jobs if j not in in_slab], None)
        return True

    def _step_together(self, jobs: list[Job], slab: KVSlab | None) -> None:
        """One step for ``jobs``: over ``slab`` (one attention call per layer) or over their
        own buffers."""
        if not jobs:
            return
        runner = self._runner()
        try:
            steps = step.batched(runner, jobs, slab)
        except Exception:  # find whose step failed: each alone, the others go on
            alone = step.alone(runner)
            for job in jobs:
                self._advance(job, alone)
            return
        self.stats.steps += 1
        self.stats.decoded += len(jobs)
        for job, advance in zip(jobs, steps):
            self._advance(job, advance)

    def _advance(self, job: Job, advance: StreamStep) -> None:
        if job.stream is None:
            return
        try:
            done = self.deliver(job, advance(job.stream))
        except Exception as exc:
            self.free([job])
            job.handle.fail(exc)
            done = True
        if done:
            self.jobs.remove(job)

    def deliver(self, job: Job, deltas: list[str]) -> bool:
        """Hand out ``deltas``; whether the request is done (its result handed out, its blocks
        freed)."""
        job.handle.put(deltas)
        stream = job.stream
        if stream is None or stream.result is None:
            return False
        self.free([job])  # first: whoever sees the result sees its slot and blocks free
        job.handle.finish(stream.result)
        return True

    def free(self, jobs: list[Job]) -> None:
        """Give back ``jobs``' pool blocks and slots; their request KVs go with them."""
        for job in jobs:
            if job.blocks:
                self.pool.free(job.blocks)
                job.blocks = 0
            self.slots.release(job)
            job.stream = None
