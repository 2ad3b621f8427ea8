"""How a scheduler's prefills run: on how many worker threads, and a group of requests admitted
together either packed into shared forwards (engine/request/packing.py) or one after another,
each through its engine's own prefill (any mode), so that its first token is what it would be
alone."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from blendrag.engine import GenerationStream
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.request.packing import run_together
from blendrag.serving.config import (
    DEFAULT_GPU_PIECE_TOKENS,
    DEFAULT_PACK_TOKENS,
    DEFAULT_PIECE_TOKENS,
)
from blendrag.serving.jobs import Job

Outcome = GenerationStream | BaseException
"""A prefilled request's token stream, or the error its prefill met."""


def default_workers(device: torch.device, threads: int) -> int:
    """Prefill workers when the config leaves them out: one on a GPU; on a CPU one when the
    cores hold both the decoding loop's ``threads`` torch threads and a worker's (a prefill
    then computes beside the steps instead of stalling them), none otherwise."""
    if device.type == "cuda":
        return 1
    return int(cores() >= 2 * threads)


def default_pack_tokens(device: torch.device) -> int:
    """Computed tokens packed into one forward at most when the config leaves it out: none on
    a CPU, whose prefills are bound by their arithmetic; ``DEFAULT_PACK_TOKENS`` on a GPU,
    where a short pass is bound by reading the weights."""
    return DEFAULT_PACK_TOKENS if device.type == "cuda" else 0


def default_piece_tokens(device: torch.device) -> int:
    """Tokens of a prefill piece when the config leaves them out: ``DEFAULT_PIECE_TOKENS`` on a
    CPU, ``DEFAULT_GPU_PIECE_TOKENS`` on a GPU (serving.config says why)."""
    return DEFAULT_GPU_PIECE_TOKENS if device.type == "cuda" else DEFAULT_PIECE_TOKENS


def prefill_jobs(runner: ModelRunner, jobs: list[Job], pack_tokens: int,
                 pieces: PrefillPieces | None, then: Callable[[Job, Outcome], None]) -> None:
    """Prefill ``jobs`` (all over ``runner``'s model): packed into forwards of at most
    ``pack_tokens`` computed tokens, or one after another (``pack_tokens`` 0, or one job);
    ``then(job, outcome)`` as soon as each has its outcome."""
    if len(jobs) == 1 or pack_tokens == 0:
        for job in jobs:
            then(job, _alone(job, pieces))
        return
    steps = [job.engine.stream_steps(job.layout, job.blend, job.generation,
                                     started=job.started, pieces=pieces)
             for job in jobs]
    run_together(runner, steps, pack_tokens, on_result=lambda j, out: then(jobs[j], out))


def _alone(job: Job, pieces: PrefillPieces | None) -> Outcome:
    """``job`` prefilled alone -> its token stream, or its error."""
    try:
        return job.engine.stream(job.layout, job.blend, job.generation, started=job.started,
                                 pieces=pieces)
    except Exception as exc:
        return exc


def cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS says, which a
    container's limit narrows; else the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
