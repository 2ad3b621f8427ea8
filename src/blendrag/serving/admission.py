"""A scheduler's admission: who is refused at once, and who may start now.

At submit, a request whose prompt and answer could never fit the KV pool is refused with the
numbers (``too_large``), before it takes a slot. Each turn of the decoding loop, the waiting
requests start in their order while a sequence slot and room in the pool are free (and, when
the loop prefills them itself between its steps, prefill tokens are left this turn): each one
started has its pool blocks reserved and its slab slot claimed (``admissible``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from blendrag.config import GenerationConfig
from blendrag.prompt import PromptLayout
from blendrag.serving.config import ServingConfig
from blendrag.serving.errors import PromptTooLarge
from blendrag.serving.jobs import Job
from blendrag.serving.pool import BlockPool
from blendrag.serving.slots import SlabSlots


def too_large(pool: BlockPool, rows: int, layout: PromptLayout,
              generation: GenerationConfig) -> PromptTooLarge | None:
    """The error for a request of ``layout`` whose KV of ``rows`` rows (prompt and answer)
    could never fit ``pool``; None when it fits."""
    if pool.fits_ever(rows):
        return None
    return PromptTooLarge(
        f"the prompt ({layout.num_tokens} tokens) and its answer (max_new_tokens="
        f"{generation.max_new_tokens}) need {pool.blocks_for(rows)} blocks of "
        f"{pool.block_tokens} rows; the KV pool holds {pool.blocks} (ServingConfig.pool_tokens)")


def admissible(waiting: deque[Job], busy: int, config: ServingConfig, pool: BlockPool,
               slots: SlabSlots, rows_for: Callable[[int], int], inline: bool) -> list[Job]:
    """Take from ``waiting`` the requests that may start now, in order, their pool blocks
    reserved and slots claimed: while fewer than ``config.max_seqs`` requests are busy
    (``busy`` now, prefilling or decoding) and the pool has room for the next (``inline``: and
    ``config.max_prefill_tokens`` prompt tokens are left this turn). ``rows_for``: the rows of
    a request KV of that many tokens. The caller holds the lock that guards ``waiting``."""
    jobs: list[Job] = []
    try:
        _take(waiting, busy, config, pool, slots, rows_for, inline, jobs)
    except BaseException:  # none of them started: waiting again, first in line, holding nothing
        for job in reversed(jobs):
            pool.free(job.blocks)
            job.blocks = 0
            slots.release(job)
            waiting.appendleft(job)
        raise
    return jobs


def _take(waiting: deque[Job], busy: int, config: ServingConfig, pool: BlockPool,
          slots: SlabSlots, rows_for: Callable[[int], int], inline: bool,
          jobs: list[Job]) -> None:
    """``admissible``'s loop: the requests that may start, into ``jobs`` as each is taken."""
    budget = config.max_prefill_tokens
    while waiting and busy + len(jobs) < config.max_seqs:
        job = waiting[0]
        tokens = job.layout.num_tokens
        if inline and jobs and tokens > budget:
            break  # the next turn's: the running requests decode first
        blocks = pool.reserve(rows_for(tokens + job.generation.max_new_tokens))
        if blocks is None:
            break  # room once a running request is done
        try:
            slot = slots.claim(tokens + job.generation.max_new_tokens)
        except BaseException:  # still waiting, its blocks given back
            pool.free(blocks)
            raise
        waiting.popleft()
        job.blocks, job.slot = blocks, slot
        jobs.append(job)
        budget -= tokens
