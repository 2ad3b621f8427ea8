"""Many requests coming and going at random (seeded): every request ends, with its answer alone
or with a clear error (cancelled, timed out, its hook failed); the ones that end well answer as
alone; once they are all done every KV slot and pool block is free, whatever mix of slab
slots and own buffers (prompts longer than a slot), prefills in pieces, and workers."""

from __future__ import annotations

import random
import threading
import time

import pytest

from blendrag import BlendConfig, GenerationConfig
from blendrag.serving import RequestCancelled, RequestTimeout, Scheduler, ServingConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

MODES = (BlendConfig(mode="full"), BlendConfig(mode="reuse"),
         BlendConfig(mode="blend", ratio=0.3))
REQUESTS = 24


def _settle(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + 30
    while scheduler.running or scheduler.waiting:
        if time.monotonic() > deadline:
            raise AssertionError("the scheduler never settled")
        time.sleep(0.01)


@pytest.mark.parametrize("workers", [0, 1])
def test_requests_coming_and_going_leave_nothing_held(engine_for, workers):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = [engine.build_prompt(PREFIX, PASSAGES[:k], SUFFIX) for k in (1, 2, 4)]
    # the two shorter prompts fit a slot, the longest does not: both kinds at once
    slot = layouts[1].num_tokens + 16
    scheduler = Scheduler(engine.runner, ServingConfig(
        max_seqs=4, slot_tokens=slot, prefill_workers=workers, prefill_piece_tokens=16))
    wants: dict[tuple[int, int, int], list[int]] = {}
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(j: int) -> None:
        rng = random.Random(100 * workers + j)  # each request's own draws
        time.sleep(rng.random() * 0.2)
        li, mi, n = rng.randrange(3), rng.randrange(3), rng.choice((4, 9, 16))
        gen = GenerationConfig(max_new_tokens=n, eos_token_ids=())
        kind = rng.choice(("plain", "plain", "cancel", "timeout", "fails"))
        prepare = None
        if kind == "fails":
            def prepare(pre):
                raise RuntimeError("hook failed")
        handle = scheduler.submit(engine, layouts[li], MODES[mi], gen, prepare=prepare,
                                  timeout_s=0.001 if kind == "timeout" else None)
        if kind == "cancel":
            time.sleep(rng.random() * 0.05)
            handle.cancel()
        try:
            got = handle.wait(60).token_ids
        except (RequestCancelled, RequestTimeout, RuntimeError) as exc:
            with lock:
                outcomes.append(type(exc).__name__)
            return
        with lock:
            wants.setdefault((li, mi, n), got)
            outcomes.append("done")
            assert got == wants[(li, mi, n)]

    threads = [threading.Thread(target=one, args=(j,)) for j in range(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(outcomes) == REQUESTS and "done" in outcomes
    for (li, mi, n), got in wants.items():  # each answer, served among the others, as alone
        alone = engine.generate(layouts[li], MODES[mi],
                                GenerationConfig(max_new_tokens=n, eos_token_ids=()))
        assert got == alone.token_ids
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    slab = engine.runner.slab(4, slot)
    assert slab is not None and slab.free_slots == slab.slots
    scheduler.close()
