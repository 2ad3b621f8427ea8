"""The scheduler: many requests on one model, continuous batching.

Requests from any thread or event loop join one queue (``submit``). One thread decodes; each
turn of its loop:

1. drops the requests that were cancelled or ran past their timeout (their pool blocks freed);
2. admits waiting requests while there is a free sequence slot and room in the KV pool, and
   has them prefilled: by the prefill worker (``ServingConfig.prefill_workers``, a thread of its
   own, so that a new prompt's prefill runs beside the running requests' decoding instead of
   stalling it: the default on a GPU, and on a CPU whose cores hold both threads), or in this
   thread between two steps (at most ``max_prefill_tokens`` prompt tokens a turn). Each
   prefill is the engine's own, in whatever mode the request asked for (blend, reuse, prefix
   cache, full), so its first token is what it would be alone (a long one runs in pieces,
   engine/compute/pieces.py: equal within rounding);
3. decodes the next token of every running request in one batched step: requests join the
   batch after their prefill and leave it at their last token, at every step.

A request is prefilled as alone, then its rows move into a slot of the model's KV slab
(engine/compute/slab.py: ``ServingConfig.slot_tokens`` rows each), where it decodes: the
slab's requests in one step with one attention call per layer (``ModelRunner.decode_slab``).
A request longer than a slot keeps its own buffer and decodes beside them
(``ModelRunner.decode_many``: attention per request). Nothing one request computes reads
another's rows (each batch row attends over its own slot), so requests of different
namespaces, modes and generation settings share a step and each gets its own answer; a
request's slot is emptied of its rows for whoever holds its ``Prefill`` once it is done.
The scheduler is shared by every view of an engine (``shared.py``: one per model). Its
prefill side (admission, where each prefill runs) is ``prefill_side.py``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.threads import torch_threads
from blendrag.engine.request.prefill import Prefill
from blendrag.prompt import PromptLayout
from blendrag.serving import admission, prefills
from blendrag.serving.config import ServingConfig
from blendrag.serving.errors import QueueFull, RequestTimeout
from blendrag.serving.handle import ServedRequest
from blendrag.serving.jobs import Job, SchedulerStats
from blendrag.serving.pool import BlockPool
from blendrag.serving.prefill_side import PrefillSide
from blendrag.serving.running import RunningRequests
from blendrag.serving.slots import SlabSlots
from blendrag.serving.workers import PrefillWorkers

log = logging.getLogger(__name__)

WAIT_S = 0.05
"""How long the loop waits when it can neither admit nor decode (a prefill in flight, the pool
full): a finished prefill or a new request wakes it sooner."""


class Scheduler(PrefillSide):
    """Serves the requests of the engines that share ``runner`` (an engine and its namespace
    views) as ``config`` says."""

    def __init__(self, runner: ModelRunner, config: ServingConfig | None = None) -> None:
        # held weakly: the registry of schedulers (shared.py) must not keep a model alive that
        # nobody serves any more (a running request holds its engine, and so the model)
        self._runner = weakref.ref(runner)
        self.config = config if config is not None else ServingConfig()
        self.pool = BlockPool(self._pool_tokens() // self.config.block_tokens,
                              self.config.block_tokens)
        self.stats = SchedulerStats()
        self._waiting: deque[Job] = deque()
        self._ready: list[Job] = []  # prefilled by a worker, joining at the next step
        self._prefilling = 0
        self._workers: PrefillWorkers | None = None  # made at the first admission to them
        self._workers_set: int | None = self.config.prefill_workers  # None: ``_workers_count``
        self._engine_threads: int | None = None  # set by submit (``_threads``)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._slots = SlabSlots(lambda: self.runner, self.config.max_seqs,
                                self.config.slot_tokens)
        self._running = RunningRequests(lambda: self.runner, self.pool, self._slots, self.stats)

    @property
    def runner(self) -> ModelRunner:
        """The model this scheduler serves."""
        runner = self._runner()
        if runner is None:
            raise RuntimeError("the scheduler's model is gone (its engine was dropped)")
        return runner

    def _pool_tokens(self) -> int:
        if self.config.pool_tokens is not None:
            return self.config.pool_tokens
        return self.config.max_seqs * self.runner.max_positions

    # ---- submitting --------------------------------------------------------------------------

    def submit(self, engine: BlendEngine, layout: PromptLayout, blend: BlendConfig,
               generation: GenerationConfig, *, timeout_s: float | None = None,
               started: float | None = None,
               prepare: Callable[[Prefill], None] | None = None) -> ServedRequest:
        """Queue one request of ``engine`` (this scheduler's model, any namespace view) -> its
        handle. Raises at once, taking no slot: ``QueueFull``, ``PromptTooLarge``, or the
        engine's ValueError for a prompt longer than the model's context. ``timeout_s``: this
        request's (default ``config.timeout_s``); ``started``: when it arrived (its TTFT counts
        from there); ``prepare(prefill)``: called once it is prefilled, before its first
        token."""
        if engine.runner is not self.runner:
            raise ValueError("the engine runs another model than this scheduler's")
        if engine.tokenizer is None:
            raise ValueError("serving text needs a tokenizer; use prefill() on token ids without "
                             "one")
        engine.check_length(layout, generation.max_new_tokens - 1)  # the last is not fed
        refused = admission.too_large(
            self.pool, self.runner.rows_for(layout.num_tokens + generation.max_new_tokens),
            layout, generation)
        if refused is not None:
            self.stats.refused += 1
            raise refused
        timeout_s = timeout_s if timeout_s is not None else self.config.timeout_s
        now = time.perf_counter()
        started = now if started is None else started
        job = Job(engine, layout, blend, generation, ServedRequest(), started, timeout_s,
                  None if timeout_s is None else now + timeout_s, prepare)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            if len(self._waiting) >= self.config.max_queue:
                self.stats.refused += 1
                raise QueueFull(f"{len(self._waiting)} requests are waiting "
                                f"(ServingConfig.max_queue={self.config.max_queue}); retry later")
            self._waiting.append(job)
            self._engine_threads = engine.threads
            self.stats.requests += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="blendrag-scheduler",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job.handle

    def close(self) -> None:
        """Fail every request not done yet and stop the thread."""
        with self._cond:
            self._closed = True
            jobs = [*self._waiting, *self._running.jobs, *self._ready]
            self._waiting.clear()
            # no worker took them yet: none will
            admitted = self._workers.drop() if self._workers is not None else []
            self._prefilling -= len(admitted)
            self._cond.notify_all()
        self._running.free(admitted)
        for job in [*jobs, *admitted]:
            job.handle.fail(RuntimeError("the scheduler was closed"))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._workers is not None:
            self._workers.shutdown()
        with self._cond:  # prefilled by a worker after the loop stopped: nobody decodes them
            late, self._ready = self._ready, []
        self._running.free(late)
        for job in late:
            job.handle.fail(RuntimeError("the scheduler was closed"))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running(self) -> int:
        """Requests prefilling or decoding."""
        return len(self._running.jobs) + len(self._ready) + self._prefilling

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ---- the loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                if not self._closed and not self._work():
                    self._cond.wait(self.config.idle_s)
                if self._closed or not self._work():
                    # decided and left under one hold of the lock: a request submitted after
                    # it finds no thread and starts one
                    self._thread = None
                    self._join_ready()
                    jobs, self._running.jobs = self._running.jobs, []
                    break
            try:
                self._turn()
            except Exception as exc:  # a defect, not a request's failure: the loop goes on
                log.exception("the scheduler's loop failed; failing the requests it held")
                self._fail_held(exc)
                with self._cond:  # not at full speed should it fail again at once
                    if not self._closed:
                        self._cond.wait(WAIT_S)
        self._running.free(jobs)
        if self._closed:  # those close() did not see (prefilling then): failed, not left waiting
            for job in jobs:
                job.handle.fail(RuntimeError("the scheduler was closed"))

    def _turn(self) -> None:
        """One turn of the loop: drop the requests gone, admit, decode a step."""
        self._drop_gone()
        with torch_threads(self._threads()):
            admitted = self._admit()
            took = self._prefill_idle()
        with torch_threads(self._step_threads()):
            stepped = self._step()
        if not (admitted or took or stepped):
            with self._cond:
                if not self._ready and not self._closed:
                    self._cond.wait(WAIT_S)

    def _fail_held(self, exc: Exception) -> None:
        """After an error the loop did not expect: every request it holds (waiting, prefilled,
        decoding) fails with it and frees its slot and blocks, rather than wait for a step that
        may fail again; requests still prefilling on a worker join the next turn."""
        with self._cond:
            self._join_ready()
            jobs = [*self._waiting, *self._running.jobs]
            self._waiting.clear()
            self._running.jobs = []
        self._running.free(jobs)
        for job in jobs:
            job.handle.fail(RuntimeError(f"the scheduler's loop failed: {exc!r}"))

    def _work(self) -> bool:
        return bool(self._waiting or self._running.jobs or self._ready or self._prefilling)

    def _threads(self) -> int | None:
        """torch's CPU threads for the scheduler's computing: the config's, else those of the
        engine last submitted to (the views of one engine share its setting)."""
        return self.config.threads if self.config.threads is not None else self._engine_threads

    def _step_threads(self) -> int | None:
        """torch's CPU threads for a decoding step: on a CPU with a prefill worker, while no
        prefill runs, the worker's cores too (a step of a few requests is bound by the one
        core otherwise; docs/benchmarks.md); else ``_threads``."""
        threads = self._threads()
        if (threads is None or self.runner.device.type != "cpu"
                or self._workers_count() == 0 or self._prefilling):
            return threads
        return min(threads * (1 + self._workers_count()), prefills.cores())

    def _drop_gone(self) -> None:
        """Free the requests that were cancelled or ran past their timeout."""
        now = time.perf_counter()
        with self._cond:
            self._join_ready()
            gone = [j for j in (*self._waiting, *self._running.jobs) if j.gone(now)]
        phases = ["decoding" if job.stream is not None else "waiting to start" for job in gone]
        # freed first, and before they leave the lists: whoever sees a request fail or go sees
        # its slot and blocks free
        self._running.free(gone)
        for job, phase in zip(gone, phases):
            if job.handle.cancelled:
                self.stats.cancelled += 1
            else:
                self.stats.timed_out += 1
                job.handle.fail(RequestTimeout(
                    f"the request was not done within its timeout of {job.timeout_s:g} s "
                    f"({phase})"))
        with self._cond:
            self._waiting = deque(j for j in self._waiting if j not in gone)
        self._running.jobs = [j for j in self._running.jobs if j not in gone]

    def _step(self) -> bool:
        """One batched decoding step over the running requests; whether there was one."""
        with self._cond:
            self._join_ready()
        return self._running.step()

    def _join_ready(self) -> None:
        """The requests a worker prefilled join the running ones (the caller holds ``_cond``)."""
        self._running.jobs += self._ready
        self._ready.clear()
