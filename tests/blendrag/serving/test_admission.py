"""Admission: a request that could never fit the KV pool is refused with the numbers; the waiting
requests start in order while sequence slots, pool blocks and (prefilled between steps) the
turn's prefill tokens allow, each with its blocks reserved."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from blendrag import GenerationConfig
from blendrag.serving import PromptTooLarge, ServingConfig
from blendrag.serving.admission import admissible, too_large
from blendrag.serving.pool import BlockPool
from blendrag.serving.slots import SlabSlots


def _job(prompt: int, answer: int = 16):
    return SimpleNamespace(layout=SimpleNamespace(num_tokens=prompt),
                           generation=GenerationConfig(max_new_tokens=answer), blocks=0,
                           slot=-1)


def _admit(waiting, busy=0, blocks=100, inline=False, **config):
    pool = BlockPool(blocks, 16)
    no_slab = SlabSlots(lambda: None, 4, 0)  # no slab: every request in a buffer of its own
    jobs = admissible(waiting, busy, ServingConfig(**config), pool, no_slab, lambda n: n, inline)
    return jobs, pool


def test_a_request_that_never_fits_is_refused_with_the_numbers():
    pool = BlockPool(4, 16)  # 64 rows
    layout = SimpleNamespace(num_tokens=60)
    assert too_large(pool, 48, layout, GenerationConfig(max_new_tokens=4)) is None
    error = too_large(pool, 80, layout, GenerationConfig(max_new_tokens=20))
    assert isinstance(error, PromptTooLarge)
    assert "60 tokens" in str(error) and "5 blocks of 16" in str(error) and "holds 4" in str(error)


def test_requests_start_in_order_while_sequence_slots_are_free():
    waiting = deque(_job(32) for _ in range(5))
    first = list(waiting)
    jobs, pool = _admit(waiting, busy=1, max_seqs=3)
    assert jobs == first[:2] and list(waiting) == first[2:]
    assert [j.blocks for j in jobs] == [3, 3]  # 48 rows each, in blocks of 16
    assert pool.free_blocks == 100 - 6
    assert all(j.slot is None for j in jobs)  # no slab: no slot


def test_a_full_pool_stops_admission_in_order():
    waiting = deque([_job(32), _job(200), _job(16)])
    jobs, pool = _admit(waiting, blocks=8)
    assert [j.layout.num_tokens for j in jobs] == [32]  # 216 rows do not fit 5 blocks left
    assert [j.layout.num_tokens for j in waiting] == [200, 16]  # the third waits its turn
    assert pool.free_blocks == 5


def test_between_steps_a_turn_prefills_its_budget_and_at_least_one():
    waiting = deque([_job(300), _job(300), _job(100)])
    jobs, _ = _admit(waiting, inline=True, max_prefill_tokens=400)
    assert [j.layout.num_tokens for j in jobs] == [300]  # the next 300 is the next turn's
    waiting = deque([_job(900)])
    jobs, _ = _admit(waiting, inline=True, max_prefill_tokens=400)
    assert len(jobs) == 1  # longer than a turn's budget: it still starts, alone
    waiting = deque([_job(300), _job(300)])
    jobs, _ = _admit(waiting, inline=False, max_prefill_tokens=400)
    assert len(jobs) == 2  # prefill workers: no budget per turn
