"""The scheduler's prefill side: which waiting requests start, and where each is prefilled (by
a prefill worker beside the decoding loop, or in the loop's own thread between two steps),
packed together where ``ServingConfig.pack_tokens`` allows, in pieces that leave room for the
running requests' steps. The decoding side (the queue, the loop, the steps) is
``scheduler.py``; ``Scheduler`` is both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch

from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.threads import torch_threads
from blendrag.serving import admission, prefills
from blendrag.serving.config import ServingConfig
from blendrag.serving.jobs import Job
from blendrag.serving.pool import BlockPool
from blendrag.serving.running import RunningRequests
from blendrag.serving.slots import SlabSlots
from blendrag.serving.workers import PrefillWorkers

log = logging.getLogger(__name__)


class PrefillSide:
    """Admission and prefill of a scheduler's requests, over the state the scheduler keeps
    (declared here, set in ``Scheduler.__init__``; ``_cond`` guards the lists and counts)."""

    config: ServingConfig
    pool: BlockPool
    _cond: threading.Condition
    _waiting: deque[Job]
    _ready: list[Job]  # prefilled by a worker, joining at the next step
    _prefilling: int  # admitted, neither waiting nor running yet
    _workers: PrefillWorkers | None
    _workers_set: int | None
    _running: RunningRequests
    _slots: SlabSlots
    _thread: threading.Thread | None
    _closed: bool

    @property
    def runner(self) -> ModelRunner:
        raise NotImplementedError

    def _threads(self) -> int | None:
        raise NotImplementedError

    def _step(self) -> bool:
        raise NotImplementedError


    def _workers_count(self) -> int:
        """Prefill workers: the config's, else ``prefills.default_workers``."""
        if self._workers_set is None:
            threads = self._threads() or torch.get_num_threads()
            self._workers_set = prefills.default_workers(self.runner.device, threads)
        return self._workers_set

    def _admit(self) -> bool:
        """Start the prefill of waiting requests while slots and pool blocks allow, together
        (``_prefill_group``); whether any started."""
        jobs = self._admissible(inline=self._workers_count() == 0)
        if not jobs:
            return False
        if self._workers_count() == 0:
            self._prefill_group(jobs, self._start_decoding)
            return True
        try:
            if self._workers is None:
                self._workers = PrefillWorkers(self._workers_count(), self._cond,
                                               self._prefill_taken,
                                               lambda: self._pack_tokens() > 0)
            self._workers.hand(jobs)
        except BaseException:  # not handed over: counted as prefilling by nobody's work
            with self._cond:
                self._prefilling -= len(jobs)
                self._waiting.extendleft(reversed(jobs))
            self._running.free(jobs)
            raise
        return True

    def _admissible(self, inline: bool) -> list[Job]:
        """Take the waiting requests that may start now (``admission.admissible``), counted
        as prefilling from here."""
        with self._cond:
            if self._closed:
                return []
            busy = len(self._running.jobs) + len(self._ready) + self._prefilling
            jobs = admission.admissible(self._waiting, busy, self.config, self.pool,
                                        self._slots, self.runner.rows_for, inline)
            self._prefilling += len(jobs)  # neither waiting nor running: counted until it is
        now = time.perf_counter()
        for job in jobs:
            job.handle.queued_s = now - job.started
        return jobs

    def _start_decoding(self, job: Job, live: bool) -> None:
        """A request prefilled in the decoding loop's thread: it decodes from the next step."""
        with self._cond:
            self._prefilling -= 1
            if live:
                self._running.jobs.append(job)

    def _pack_tokens(self) -> int:
        """Computed tokens packed into one forward at most: the config's, else
        ``prefills.default_pack_tokens``."""
        if self.config.pack_tokens is not None:
            return self.config.pack_tokens
        return prefills.default_pack_tokens(self.runner.device)

    def _prefill_idle(self) -> bool:
        """On a CPU, while nothing decodes, this thread's core would idle as the worker
        prefills: it prefills the latest admitted request itself (a burst of arrivals then
        prefills on both cores); whether it took one."""
        if self.runner.device.type != "cpu":
            return False
        with self._cond:
            if self._running.jobs or self._ready or self._workers is None:
                return False
            job = self._workers.take()
        if job is None:
            return False
        self._prefill_group([job], self._start_decoding)
        return True

    def _prefill_taken(self, jobs: list[Job]) -> None:
        """A prefill worker's prefill of ``jobs``, each handed to the decoding loop as soon as
        it has its first token; whatever an interrupt leaves without a result
        fails and frees its slot and blocks."""
        left = set(map(id, jobs))

        def ready(job: Job, live: bool) -> None:
            with self._cond:
                left.discard(id(job))
                self._prefilling -= 1
                if live:
                    self._ready.append(job)
                self._cond.notify_all()
        try:
            with torch_threads(self._threads()):
                self._prefill_group(jobs, ready)
        finally:  # those an interrupt left without a result: no longer prefilling
            for job in jobs:
                if id(job) in left:
                    self._running.free([job])
                    job.handle.fail(RuntimeError("the request's prefill was interrupted"))
                    ready(job, False)

    def _prefill_group(self, jobs: list[Job], then: Callable[[Job, bool], None]) -> None:
        """Prefill ``jobs`` together (``prefills.prefill_jobs``); ``then(job, live)`` as soon
        as each has its first token handed out (``live``: it goes on decoding) or has
        failed."""
        prefills.prefill_jobs(self.runner, jobs, self._pack_tokens(), self._pieces(),
                              lambda job, out: then(job, self._running.start(job, out)))

    def _pieces(self) -> PrefillPieces | None:
        """How a prefill starting now leaves room for the running requests between its pieces:
        in the decoding loop's thread it decodes a step for them; on a prefill worker on a GPU it
        waits for each piece, so that their steps run between two (on a CPU a worker computes
        on a core of its own: nothing to leave room for)."""
        tokens = self.config.prefill_piece_tokens
        if tokens is None:
            tokens = prefills.default_piece_tokens(self.runner.device)
        if tokens == 0:
            return None
        if threading.current_thread() is self._thread:
            return PrefillPieces(tokens, self._between)
        device = self.runner.device
        if device.type == "cuda":
            return PrefillPieces(tokens, torch.cuda.current_stream(device).synchronize)
        return None

    def _between(self) -> None:
        """Between two pieces of a prefill in this thread: a step for the running requests
        (whatever it meets is theirs, never the prefilling request's)."""
        if self._closed:
            return
        try:
            with torch_threads(self._threads()):
                self._step()
        except Exception:  # a step's own failures are handled in it; anything else: logged
            log.exception("a decoding step between two prefill pieces failed")
