"""`blendrag bench serve`: one engine serving many users, against the same engine serving one
request at a time, over the same RAG prompts.

Workload: MuSiQue questions with ``passages`` passages each (cut to ``passage_tokens``), the
passages ingested before anything is timed, answers of exactly ``answer_tokens`` tokens (EOS
ignored, so every configuration decodes the same work), greedy. Per mode (full prefill, the
default blend):

- ``one at a time``: every request through ``engine.stream`` in turn (the engine as it was
  before it had a scheduler): the baseline;
- ``U users``: U closed-loop users, each sending its next request when its answer is done,
  through the scheduler (blendrag.serving);
- ``poisson R/s``: requests arriving at random at R per second, through the scheduler.

Per run: requests/s, output tokens/s, p50/p95 TTFT (from the request's arrival to its first
text delta: queueing included), p50/p95 time per output token, each against the baseline, and
how many answers equal the baseline's token for token, and the share of the process's cores the
run kept busy (its CPU seconds over wall seconds times cores: how much room a schedule leaves).
"""

from __future__ import annotations

import copy
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial

from blendrag.config import BlendConfig, GenerationConfig
from blendrag.engine.engine import BlendEngine
from blendrag.prompt import PromptLayout
from blendrag.serving import Scheduler, ServingConfig
from blendrag.serving.jobs import SchedulerStats
from blendrag.serving.prefills import cores
from blendrag_bench.datasets import load_musique
from blendrag_bench.quality import fit_item
from blendrag_bench.serve_report import Served, summary

MODES = {"full": BlendConfig(mode="full"), "default": BlendConfig()}


@dataclass(frozen=True)
class ServeBenchConfig:
    """users: closed-loop user counts; rates: Poisson arrival rates (requests/s);
    requests: requests per run (the baseline's); rounds: a served run sends the requests this
    many times over (closed-loop users all start at once: with one request each, every TTFT
    is the opening burst's; past their first, users keep their own rhythm);
    passages/passage_tokens: each prompt's retrieved passages; answer_tokens: tokens decoded
    per answer; modes: names in ``MODES``."""

    users: tuple[int, ...] = (1, 2, 4)
    rates: tuple[float, ...] = ()
    requests: int = 8
    rounds: int = 1
    passages: int = 5
    passage_tokens: int = 100
    answer_tokens: int = 32
    modes: tuple[str, ...] = ("full", "default")
    max_seqs: int = 16
    serve_threads: int | None = None  # the scheduler's torch threads (None: the engine's)
    prefill_workers: int | None = None  # ServingConfig.prefill_workers (None: per device)
    prefill_piece_tokens: int | None = None  # ServingConfig's (None: per device; 0: whole)
    slot_tokens: int = ServingConfig.slot_tokens  # 0: no slab
    pack_tokens: int | None = None  # ServingConfig.pack_tokens (None: per device)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.users and not self.rates:
            raise ValueError("give at least one user count or arrival rate")
        if any(u < 1 for u in self.users) or any(not r > 0 for r in self.rates):
            raise ValueError(f"users must be >= 1 and rates > 0, got {self.users}, {self.rates}")
        for name in ("requests", "rounds", "passages", "passage_tokens", "answer_tokens",
                     "max_seqs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        unknown = set(self.modes) - set(MODES)
        if unknown or not self.modes:
            raise ValueError(f"modes must be among {sorted(MODES)}, got {self.modes}")


def prompts(engine: BlendEngine, cfg: ServeBenchConfig) -> list[PromptLayout]:
    """The workload's prompts, their passages ingested."""
    items = [fit_item(engine, it, cfg.passage_tokens)
             for it in load_musique(limit=cfg.requests, passages=cfg.passages)]
    for it in items:
        engine.ingest(list(it.chunks), it.prefix)
    return [engine.build_prompt(it.prefix, list(it.chunks), it.suffix) for it in items]


def one_at_a_time(engine: BlendEngine, layouts: list[PromptLayout], blend: BlendConfig,
                  gen: GenerationConfig) -> tuple[list[Served], float]:
    out, t0 = [], time.perf_counter()
    for layout in layouts:
        served = Served(time.perf_counter())
        stream = engine.stream(layout, blend, gen, started=served.arrived)
        _read(served, stream)
        served.tokens = stream.result.token_ids if stream.result else []
        served.work = stream.result.stats.timing.work_s if stream.result else 0.0
        out.append(served)
        del stream  # its prefill's buffer back to the pool: the next request gets it
    return out, time.perf_counter() - t0


def closed_loop(scheduler: Scheduler, engine: BlendEngine, layouts: list[PromptLayout],
                blend: BlendConfig, gen: GenerationConfig,
                users: int) -> tuple[list[Served], float]:
    """``users`` users sending ``layouts`` in turn, each its next once its answer is done;
    each user's first request is its own from the start (all users open at once: a user whose
    first answer came back before another user's thread ran took that user's request)."""
    queue = list(enumerate(layouts))
    firsts = [queue.pop(0) for _ in range(min(users, len(queue)))]
    lock = threading.Lock()
    out: list[Served | None] = [None] * len(layouts)

    def user(k: int) -> None:
        task = firsts[k] if k < len(firsts) else None
        first = True
        while task is not None:
            j, layout = task
            served = _serve(scheduler, engine, layout, blend, gen)
            served.opening, first = first, False
            out[j] = served
            with lock:
                task = queue.pop(0) if queue else None

    return _timed(lambda: _in_threads(partial(user, k) for k in range(users)), out)


def poisson(scheduler: Scheduler, engine: BlendEngine, layouts: list[PromptLayout],
            blend: BlendConfig, gen: GenerationConfig, rate: float,
            seed: int) -> tuple[list[Served], float]:
    """``layouts`` arriving at random, ``rate`` per second on average."""
    rng = random.Random(seed)
    out: list[Served | None] = [None] * len(layouts)

    def arrivals() -> None:
        threads = []
        for j, layout in enumerate(layouts):
            def one(j: int = j, layout: PromptLayout = layout) -> None:
                out[j] = _serve(scheduler, engine, layout, blend, gen)
            t = threading.Thread(target=one)
            t.start()
            threads.append(t)
            time.sleep(rng.expovariate(rate))
        for t in threads:
            t.join()

    return _timed(arrivals, out)


def _serve(scheduler: Scheduler, engine: BlendEngine, layout: PromptLayout,
           blend: BlendConfig, gen: GenerationConfig) -> Served:
    served = Served(time.perf_counter())
    handle = scheduler.submit(engine, layout, blend, gen, started=served.arrived)
    _read(served, handle)
    result = handle.wait()
    served.tokens = result.token_ids
    served.queued = handle.queued_s or 0.0
    served.work = result.stats.timing.work_s
    return served


def _read(served: Served, deltas: Iterable[str]) -> None:
    for _ in deltas:
        now = time.perf_counter()
        if not served.first:
            served.first = now
        else:
            served.gaps.append(now - served.last)
        served.last = now
    served.last = time.perf_counter()
    served.first = served.first or served.last


def _timed(run: Callable[[], None], out: list[Served | None]) -> tuple[list[Served], float]:
    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    return [s for s in out if s is not None], wall


def _in_threads(targets: Iterable[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(engine: BlendEngine, cfg: ServeBenchConfig,
        on_row: Callable[[dict], None] | None = None,
        layouts: list[PromptLayout] | None = None) -> list[dict]:
    """Every mode's baseline and runs; the rows, each also handed to ``on_row``. ``layouts``:
    the requests' prompts, their chunks stored already (default: the workload's, ingested
    here)."""
    layouts = prompts(engine, cfg) if layouts is None else layouts
    gen = GenerationConfig(max_new_tokens=cfg.answer_tokens, eos_token_ids=())
    scheduler = Scheduler(engine.runner, ServingConfig(
        max_seqs=cfg.max_seqs, max_queue=max(256, cfg.requests), threads=cfg.serve_threads,
        prefill_workers=cfg.prefill_workers, prefill_piece_tokens=cfg.prefill_piece_tokens,
        slot_tokens=cfg.slot_tokens, pack_tokens=cfg.pack_tokens))
    rows = []
    try:
        for mode in cfg.modes:
            for row in _mode_rows(scheduler, engine, layouts, MODES[mode], gen, cfg):
                row["mode"] = mode
                rows.append(row)
                if on_row is not None:
                    on_row(row)
    finally:
        scheduler.close()
    return rows


def _mode_rows(scheduler: Scheduler, engine: BlendEngine, layouts: list[PromptLayout],
               blend: BlendConfig, gen: GenerationConfig, cfg: ServeBenchConfig) -> Iterable[dict]:
    engine.generate(layouts[0], blend, gen)  # warm: the first request's one-off costs
    cpu = _cpu_s()
    base, base_wall = one_at_a_time(engine, layouts, blend, gen)
    sent, want = layouts * cfg.rounds, [s.tokens for s in base] * cfg.rounds
    yield _busy(summary("one at a time", base, base_wall, None, None, None), _cpu_s() - cpu)
    if engine.device.type == "cuda":  # untimed: the batched steps' CUDA graphs, each shape
        # captured at its second use, are captured here rather than inside a timed run
        most = max(cfg.users, default=1)
        closed_loop(scheduler, engine, layouts[:most], blend, gen, most)
    def row(name: str, serve: Callable[[], tuple[list[Served], float]]) -> dict:
        """One served run's row against the one-at-a-time baseline, with its steps' batch,
        its packed prefills and its cores' share."""
        before, cpu = copy.copy(scheduler.stats), _cpu_s()
        served, wall = serve()
        return _busy(_batched(summary(name, served, wall, base, base_wall, want), scheduler,
                              before), _cpu_s() - cpu)

    for users in cfg.users:
        yield row(f"{users} users",
                  partial(closed_loop, scheduler, engine, sent, blend, gen, users))
    for rate in cfg.rates:
        yield row(f"poisson {rate:g}/s",
                  partial(poisson, scheduler, engine, sent, blend, gen, rate, cfg.seed))


def _cpu_s() -> float:
    """This process's CPU seconds so far, every thread's (user and system)."""
    times = os.times()
    return times.user + times.system


def _busy(row: dict, cpu_s: float) -> dict:
    """``row`` with the share of the process's cores its run kept busy (``cpu_s`` CPU seconds
    over its wall seconds times the cores)."""
    row["cores_busy"] = cpu_s / (row["wall_s"] * cores())
    return row


def _batched(row: dict, scheduler: Scheduler, before: SchedulerStats) -> dict:
    """``row`` with the requests its run's decoding steps held on average and its prefills
    packed with others' (the scheduler's counts were ``before`` it)."""
    ran = scheduler.stats.steps - before.steps
    row["mean_batch"] = (scheduler.stats.decoded - before.decoded) / ran if ran else 0.0
    row["packed"] = scheduler.stats.packed - before.packed
    return row
