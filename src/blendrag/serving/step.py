"""One batched decoding step for a scheduler's running requests: the next token of each, from
one forward over the KV slab (one attention call per layer) or over their own buffers
(attention per request), returned as each stream's step to take."""

from __future__ import annotations

from collections.abc import Callable

import torch

from blendrag.engine import GenerationStream
from blendrag.engine.compute.runner import ModelRunner
from blendrag.engine.compute.slab import KVSlab
from blendrag.serving.jobs import Job

StreamStep = Callable[[GenerationStream], list[str]]
"""What a stream does with its share of a step: advance by one token -> its text deltas."""


def batched(runner: ModelRunner, jobs: list[Job], slab: KVSlab | None) -> list[StreamStep]:
    """One forward for ``jobs`` (each with a pending token; over ``slab`` when given, their
    slots in it) -> each job's step. Raises what the forward raises: the caller steps each
    alone to find whose failed."""
    streams = [j.stream for j in jobs if j.stream is not None]
    tokens = [s.pending for s in streams if s.pending is not None]
    kvs = [s.prefill.fused for s in streams]
    if slab is not None:
        slots = [j.slot for j in jobs if j.slot is not None]
        logits = runner.decode_slab(slab, tokens, slots, kvs)  # [N, vocab]
    else:
        logits = runner.decode_many(tokens, kvs)  # [N, vocab]
    greedy = [j for j, s in enumerate(streams) if s.greedy]
    try:  # the greedy requests' tokens in one argmax and one read of the device
        chosen = dict(zip(greedy, logits[greedy].argmax(-1).tolist())) if greedy else {}
    except Exception:  # each row on its own: a failure is that request's alone
        chosen = {}
    return [_to(chosen[j]) if j in chosen else _with(row) for j, row in enumerate(logits)]


def alone(runner: ModelRunner) -> StreamStep:
    """A stream's step decoded by itself (its own forward)."""
    def step(stream: GenerationStream) -> list[str]:
        token = stream.pending
        if token is None:
            return []
        return stream.advance(runner.decode(token, stream.prefill.fused))
    return step


def _to(token: int) -> StreamStep:
    """A stream's step that takes ``token`` (its argmax, chosen with the batch's)."""
    return lambda stream: stream.advance_to(token)


def _with(logits: torch.Tensor) -> StreamStep:
    """A stream's step that takes ``logits`` (its row of a batched step)."""
    return lambda stream: stream.advance(logits)
