"""The scheduler: many requests on one model, continuous batching.

Requests from any thread or event loop join one queue (``submit``); one thread runs the model.
Each turn of its loop:

1. drops the requests that were cancelled or ran past their timeout (their pool blocks freed);
2. admits waiting requests while there is a free sequence slot and room in the KV pool, and
   prefills them, up to ``max_prefill_tokens`` prompt tokens per turn (at least one request):
   each prefill is the engine's own, in whatever mode the request asked for (blend, reuse,
   prefix cache, full), so its first token is exactly what it would be alone;
3. decodes the next token of every running request in one batched step
   (``ModelRunner.decode_many``): requests join the batch after their prefill and leave it
   at their last token, at every step.

A request's rows live in its own request KV from its prefill to its last token; nothing one
request computes reads another's rows (the batched step attends per request), so requests of
different namespaces, modes and generation settings share a step and each gets its own answer.
The scheduler is shared by every view of an engine (``scheduler_for``): one thread per model.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine import BlendEngine, GenerationStream
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.threads import torch_threads
from blendrag.engine.request.prefill import Prefill
from blendrag.prompt import PromptLayout
from blendrag.serving.config import ServingConfig
from blendrag.serving.errors import PromptTooLarge, QueueFull, RequestTimeout
from blendrag.serving.handle import ServedRequest
from blendrag.serving.pool import BlockPool


@dataclass
class _Job:
    engine: BlendEngine
    layout: PromptLayout
    blend: BlendConfig
    generation: GenerationConfig
    handle: ServedRequest
    started: float
    deadline: float | None
    prepare: Callable[[Prefill], None] | None
    stream: GenerationStream | None = None
    blocks: int = 0  # pool blocks held while running
    timeout_s: float | None = field(default=None)


@dataclass
class SchedulerStats:
    """What the scheduler has done since it was made."""

    requests: int = 0
    steps: int = 0  # batched decoding steps
    decoded: int = 0  # tokens decoded in them
    refused: int = 0  # requests refused at submit (queue full, too large)
    timed_out: int = 0
    cancelled: int = 0

    @property
    def mean_batch(self) -> float:
        """Requests per decoding step, on average."""
        return self.decoded / self.steps if self.steps else 0.0


class Scheduler:
    """Serves the requests of the engines that share ``runner`` (an engine and its namespace
    views) as ``config`` says."""

    def __init__(self, runner: ModelRunner, config: ServingConfig | None = None) -> None:
        self.runner = runner
        self.config = config if config is not None else ServingConfig()
        self.pool = BlockPool(self._pool_tokens() // self.config.block_tokens,
                              self.config.block_tokens)
        self.stats = SchedulerStats()
        self._waiting: deque[_Job] = deque()
        self._running: list[_Job] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

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
        engine.check_length(layout, generation.max_new_tokens)
        tokens = layout.num_tokens + generation.max_new_tokens
        if not self.pool.fits_ever(tokens):
            self.stats.refused += 1
            raise PromptTooLarge(
                f"the prompt ({layout.num_tokens} tokens) and its answer (max_new_tokens="
                f"{generation.max_new_tokens}) need {self.pool.blocks_for(tokens)} blocks of "
                f"{self.pool.block_tokens} rows; the KV pool holds {self.pool.blocks} "
                "(ServingConfig.pool_tokens)")
        timeout_s = timeout_s if timeout_s is not None else self.config.timeout_s
        now = time.perf_counter()
        started = now if started is None else started
        job = _Job(engine, layout, blend, generation, ServedRequest(), started,
                   None if timeout_s is None else now + timeout_s, prepare, timeout_s=timeout_s)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            if len(self._waiting) >= self.config.max_queue:
                self.stats.refused += 1
                raise QueueFull(f"{len(self._waiting)} requests are waiting "
                                f"(ServingConfig.max_queue={self.config.max_queue}); retry later")
            self._waiting.append(job)
            self.stats.requests += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="blendrag-scheduler",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job.handle

    def wake(self) -> None:
        """Let the scheduler look at its requests now (a request was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Fail every request not done yet and stop the thread."""
        with self._cond:
            self._closed = True
            jobs = [*self._waiting, *self._running]
            self._cond.notify_all()
        for job in jobs:
            job.handle.fail(RuntimeError("the scheduler was closed"))
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ---- the loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        threads = self.config.threads
        while True:
            with self._cond:
                if not self._work():
                    self._cond.wait(self.config.idle_s)
                if self._closed or not self._work():
                    self._thread = None
                    self._free(self._running)
                    self._running = []
                    return
            self._drop_gone()
            with torch_threads(threads if threads is not None else self._engine_threads()):
                self._admit()
                self._step()

    def _work(self) -> bool:
        return bool(self._waiting or self._running)

    def _engine_threads(self) -> int | None:
        jobs = [*self._running, *self._waiting]
        return jobs[0].engine.threads if jobs else None

    def _drop_gone(self) -> None:
        """Free the requests that were cancelled or ran past their timeout."""
        now = time.perf_counter()
        with self._cond:
            gone = [j for j in (*self._waiting, *self._running) if _gone(j, now)]
            self._waiting = deque(j for j in self._waiting if j not in gone)
        self._running = [j for j in self._running if j not in gone]
        for job in gone:
            if job.handle.cancelled:
                self.stats.cancelled += 1
            else:
                self.stats.timed_out += 1
                job.handle.fail(RequestTimeout(
                    f"the request was not done within its timeout of {job.timeout_s:g} s "
                    f"({'decoding' if job.stream is not None else 'waiting to start'})"))
        self._free(gone)

    def _admit(self) -> None:
        budget = self.config.max_prefill_tokens
        while len(self._running) < self.config.max_seqs:
            with self._cond:
                if not self._waiting:
                    return
                job = self._waiting[0]
                tokens = job.layout.num_tokens
                if tokens > budget and budget < self.config.max_prefill_tokens:
                    return  # the next turn's (decoding goes on meanwhile)
                blocks = self.pool.reserve(tokens + job.generation.max_new_tokens)
                if blocks is None:
                    return  # room once a running request is done
                self._waiting.popleft()
            job.blocks = blocks
            budget -= tokens
            self._start(job)

    def _start(self, job: _Job) -> None:
        try:
            stream = job.engine.stream(job.layout, job.blend, job.generation,
                                       started=job.started)
            job.handle.prefill = stream.prefill
            if job.prepare is not None:
                job.prepare(stream.prefill)
            job.stream = stream
            self._deliver(job, stream.start())
        except Exception as exc:  # this request's error, never another's
            job.handle.fail(exc)
            self._free([job])
            return
        if job.stream is not None and job.stream.result is None:
            self._running.append(job)

    def _step(self) -> None:
        jobs = [j for j in self._running if j.stream is not None and j.stream.pending is not None]
        if not jobs:
            return
        streams = [j.stream for j in jobs if j.stream is not None]
        tokens = [s.pending for s in streams if s.pending is not None]
        try:
            logits = self.runner.decode_many(tokens, [s.prefill.fused for s in streams])
        except Exception:  # find whose step failed: each alone, the others go on
            for job in jobs:
                self._advance_alone(job)
            return
        self.stats.steps += 1
        self.stats.decoded += len(jobs)
        for job, row in zip(jobs, logits):
            self._advance(job, _with(row))

    def _advance_alone(self, job: _Job) -> None:
        def one(s: GenerationStream) -> list[str]:
            token = s.pending
            if token is None:
                return []
            return s.advance(self.runner.decode(token, s.prefill.fused))
        self._advance(job, one)

    def _advance(self, job: _Job, step: Callable[[GenerationStream], list[str]]) -> None:
        stream = job.stream
        if stream is None:
            return
        try:
            self._deliver(job, step(stream))
        except Exception as exc:
            job.handle.fail(exc)
            self._running.remove(job)
            self._free([job])

    def _deliver(self, job: _Job, deltas: list[str]) -> None:
        job.handle.put(deltas)
        stream = job.stream
        if stream is not None and stream.result is not None:
            job.handle.finish(stream.result)
            if job in self._running:
                self._running.remove(job)
            self._free([job])

    def _free(self, jobs: list[_Job]) -> None:
        for job in jobs:
            if job.blocks:
                self.pool.free(job.blocks)
                job.blocks = 0
            job.stream = None  # its request KV goes with it


def _with(logits: torch.Tensor) -> Callable[[GenerationStream], list[str]]:
    """A stream's step that takes ``logits`` (its row of a batched step)."""
    return lambda stream: stream.advance(logits)


def _gone(job: _Job, now: float) -> bool:
    return job.handle.cancelled or (job.deadline is not None and now > job.deadline)


_SCHEDULERS: weakref.WeakKeyDictionary[ModelRunner, Scheduler] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def scheduler_for(engine: BlendEngine, config: ServingConfig | None = None) -> Scheduler:
    """The scheduler of ``engine``'s model, shared by all its namespace views and every framework
    LLM over them (made at the first call; ``config`` applies then: a later different config is
    a ValueError, since one model has one scheduler)."""
    with _LOCK:
        scheduler = _SCHEDULERS.get(engine.runner)
        if scheduler is None:
            scheduler = _SCHEDULERS[engine.runner] = Scheduler(engine.runner, config)
        elif config is not None and config != scheduler.config:
            raise ValueError(f"this engine's model is served with {scheduler.config} already; "
                             "close that scheduler first")
        return scheduler
