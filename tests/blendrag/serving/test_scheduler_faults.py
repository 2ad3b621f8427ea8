"""The scheduler's loop under faults it did not expect: no request waits forever and nothing
is held after them. A slab the host cannot allocate serves every request over its own buffer;
an error in a turn fails the requests the loop held (their slots and blocks freed) and the loop
serves the next ones; a request submitted as the idle loop leaves is served; a stream closed
before its end, or a failed batched step, leaves every request's rows as they were."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.serving import RequestCancelled, Scheduler, ServingConfig
from blendrag.serving import scheduler as scheduler_module
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

GREEDY = GenerationConfig(max_new_tokens=6, eos_token_ids=())
FULL = BlendConfig(mode="full")


@pytest.fixture
def engine(engine_for):
    return engine_for("llama")


def _layout(engine, n: int = 2):
    return engine.build_prompt(PREFIX, PASSAGES[:n], SUFFIX)


def _settle(scheduler, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while (scheduler.running or scheduler.waiting) and time.monotonic() < end:
        time.sleep(0.02)


def test_a_slab_the_host_cannot_allocate_serves_over_own_buffers(engine, monkeypatch):
    """A CPU's failed allocation is a plain RuntimeError (a GPU's an OutOfMemoryError)."""
    def no_memory(*_args, **_kw):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(engine.runner, "slab", no_memory)
    want = engine.generate(_layout(engine), FULL, GREEDY)
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0))
    handles = [scheduler.submit(engine, _layout(engine), FULL, GREEDY) for _ in range(2)]
    assert all(h.wait(60).token_ids == want.token_ids for h in handles)
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    scheduler.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_an_error_the_loop_did_not_expect_fails_its_requests_and_the_loop_goes_on(
        engine, monkeypatch, workers):
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=workers))
    admissible = scheduler_module.admission.admissible
    planted = [True]

    def once(*args, **kw):
        if planted and planted.pop():
            raise RuntimeError("planted in admission")
        return admissible(*args, **kw)

    monkeypatch.setattr(scheduler_module.admission, "admissible", once)
    first = scheduler.submit(engine, _layout(engine), FULL, GREEDY)
    with pytest.raises(RuntimeError, match="planted in admission"):
        first.wait(60)
    later = scheduler.submit(engine, _layout(engine), FULL, GREEDY)
    assert len(later.wait(60).token_ids) == GREEDY.max_new_tokens
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks and scheduler.running == 0
    scheduler.close()


def test_a_request_submitted_as_the_idle_loop_leaves_is_served(engine, monkeypatch):
    """The loop decides to leave and forgets its thread under one hold of the lock: a submit
    waiting on the lock meanwhile then finds no thread and starts one."""
    scheduler = Scheduler(engine.runner, ServingConfig(idle_s=0.01, prefill_workers=0))
    work = scheduler._work
    late: list = []

    def leaving() -> bool:
        busy = work()
        if not busy and not late and scheduler._thread is threading.current_thread():
            submitter = threading.Thread(target=lambda: late.append(
                scheduler.submit(engine, _layout(engine), FULL, GREEDY)))
            late.append(submitter)
            submitter.start()  # blocks on the lock this thread holds
            time.sleep(0.1)
        return busy

    monkeypatch.setattr(scheduler, "_work", leaving)
    assert len(scheduler.submit(engine, _layout(engine), FULL, GREEDY).wait(60).token_ids) == 6
    end = time.monotonic() + 10
    while len(late) < 2 and time.monotonic() < end:
        time.sleep(0.02)
    assert len(late) == 2, "the loop never left"
    late[0].join(10)
    assert len(late[1].wait(30).token_ids) == GREEDY.max_new_tokens
    scheduler.close()


def test_a_stream_closed_before_its_end_cancels_its_request(engine):
    scheduler = Scheduler(engine.runner)
    gen = GenerationConfig(max_new_tokens=400, eos_token_ids=())
    handle = scheduler.submit(engine, _layout(engine), FULL, gen)
    stream = iter(handle)
    next(stream)  # decoding: it holds its blocks
    stream.close()  # the caller stops reading (a dropped generator is closed alike)
    assert handle.cancelled
    with pytest.raises(RequestCancelled):
        handle.wait(10)
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    assert scheduler.stats.cancelled == 1
    scheduler.close()


def test_a_failed_batched_step_appends_no_row(engine, monkeypatch):
    """``decode_many`` decodes the requests that share a forward, then the others alone: when a
    later one fails, no request KV keeps the rows appended before it, so that the retry of each
    alone appends every token once."""
    runner = engine.runner
    kvs = [engine.prefill(_layout(engine, n), FULL, 4).fused for n in (1, 2, 3)]
    lengths = [kv.length for kv in kvs]
    decode = runner.decode

    def failing(token, kv):
        if kv is kvs[2]:
            raise RuntimeError("planted in the last request's own decode")
        return decode(token, kv)

    monkeypatch.setattr(runner, "decode", failing)
    monkeypatch.setattr("blendrag.engine.compute.runner.batchable",
                        lambda kv, _static: kv is not kvs[2])
    with pytest.raises(RuntimeError, match="planted"):
        runner.decode_many([5, 6, 7], kvs)
    assert [kv.length for kv in kvs] == lengths
    monkeypatch.setattr(runner, "decode", decode)
    logits = runner.decode_many([5, 6, 7], kvs)
    assert [kv.length for kv in kvs] == [n + 1 for n in lengths]
    assert torch.isfinite(logits).all()


def test_a_fault_admitting_the_second_of_two_leaves_neither_waiting_forever(engine,
                                                                            monkeypatch):
    """The first request was taken off the queue with its blocks when the second's slot
    failed: it goes back to the queue holding nothing, and the loop's fault path fails both."""
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0))
    claim, calls = scheduler._slots.claim, []

    def second_fails(rows):
        calls.append(rows)
        if len(calls) == 2:
            raise RuntimeError("planted in the second claim")
        return claim(rows)

    monkeypatch.setattr(scheduler._slots, "claim", second_fails)
    with scheduler._cond:  # both queued before the loop's first turn
        first = scheduler.submit(engine, _layout(engine), FULL, GREEDY)
        second = scheduler.submit(engine, _layout(engine, 3), FULL, GREEDY)
    for handle in (first, second):
        with pytest.raises(RuntimeError, match="planted in the second claim"):
            handle.wait(30)
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks and scheduler.running == 0
    scheduler.close()
