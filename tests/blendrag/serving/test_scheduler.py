"""The scheduler serves many requests at once and each gets its answer exactly as alone: the
same text and tokens (greedy and seeded sampling), the same first-token logits, whatever else
shares its steps (modes, namespaces, generation settings); limits give the request they are
about a clear error and nothing to the others; cancelled and timed-out requests free their
pool blocks."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.serving import (
    PromptTooLarge,
    QueueFull,
    RequestCancelled,
    RequestTimeout,
    Scheduler,
    ServingConfig,
)
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

GREEDY = GenerationConfig(max_new_tokens=10, eos_token_ids=())
REQUESTS = [  # (passages, blend, generation): modes, lengths and settings side by side
    (PASSAGES, BlendConfig(mode="full"), GREEDY),
    (PASSAGES[:2], BlendConfig(mode="blend", ratio=0.3), GREEDY),
    (PASSAGES[1:], BlendConfig(mode="reuse"), GenerationConfig(max_new_tokens=7,
                                                               eos_token_ids=())),
    (PASSAGES[::-1], BlendConfig(mode="blend", ratio=0.2),
     GenerationConfig(max_new_tokens=9, temperature=0.8, top_k=20, seed=7, eos_token_ids=())),
]


@pytest.fixture
def engine(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    return engine


def _layouts(engine):
    return [engine.build_prompt(PREFIX, list(p), SUFFIX) for p, _, _ in REQUESTS]


def _alone(engine):
    return [engine.generate(lay, blend, gen)
            for lay, (_, blend, gen) in zip(_layouts(engine), REQUESTS)]


@pytest.mark.parametrize("workers", [0, 1])
def test_requests_served_together_get_their_answers_alone(engine, workers):
    """Prefilled beside the decoding loop (a worker) or in it between steps."""
    want = _alone(engine)
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=workers))
    handles = [scheduler.submit(engine, lay, blend, gen)
               for lay, (_, blend, gen) in zip(_layouts(engine), REQUESTS)]
    got = [h.wait(60) for h in handles]
    for a, b in zip(want, got):
        assert b.token_ids == a.token_ids and b.text == a.text
        assert b.finish_reason == a.finish_reason
        assert b.stats.mode == a.stats.mode
    if workers == 0:  # prefilled together before the first step: they share every step
        assert scheduler.stats.mean_batch > 1.5
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    scheduler.close()


def test_first_token_logits_equal_alone(engine):
    layouts = _layouts(engine)
    alone = [engine.prefill(lay, blend).logits for lay, (_, blend, _) in zip(layouts, REQUESTS)]
    scheduler = Scheduler(engine.runner)
    handles = [scheduler.submit(engine, lay, blend, gen)
               for lay, (_, blend, gen) in zip(layouts, REQUESTS)]
    for h, want in zip(handles, alone):
        h.wait(60)
        assert h.prefill is not None and torch.allclose(h.prefill.logits, want, atol=1e-4)
    scheduler.close()


def test_namespaces_share_steps_and_keep_their_own_answers(engine):
    tenant = engine.namespaced("tenant-a")
    tenant.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    reuse = BlendConfig(mode="reuse")
    want = [engine.generate(layout, reuse, GREEDY).token_ids,
            tenant.generate(layout, reuse, GREEDY).token_ids]
    scheduler = Scheduler(engine.runner)
    handles = [scheduler.submit(e, layout, reuse, GREEDY) for e in (engine, tenant)]
    assert [h.wait(60).token_ids for h in handles] == want
    assert handles[1].result is not None
    assert handles[1].result.stats.cache.chunk_hits == len(PASSAGES)  # its own store's rows
    scheduler.close()


def test_streaming_from_threads_and_event_loops(engine):
    want = [r.text for r in _alone(engine)]
    scheduler = Scheduler(engine.runner)
    layouts = _layouts(engine)
    texts: dict[int, str] = {}

    def user(j):
        lay, (_, blend, gen) = layouts[j], REQUESTS[j]
        texts[j] = "".join(scheduler.submit(engine, lay, blend, gen))

    async def users():
        async def one(j):
            lay, (_, blend, gen) = layouts[j], REQUESTS[j]
            return "".join([d async for d in scheduler.submit(engine, lay, blend, gen)])
        return await asyncio.gather(*(one(j) for j in (2, 3)))

    threads = [threading.Thread(target=user, args=(j,)) for j in (0, 1)]
    for t in threads:
        t.start()
    texts.update(zip((2, 3), asyncio.run(users())))
    for t in threads:
        t.join(60)
    assert [texts[j] for j in range(4)] == want
    scheduler.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_full_queue_refuses_only_the_new_request(engine, workers):
    scheduler = Scheduler(engine.runner, ServingConfig(max_queue=1, max_seqs=1,
                                                       prefill_workers=workers))
    layout = _layouts(engine)[0]
    first = scheduler.submit(engine, layout, BlendConfig(mode="full"), GREEDY)
    refused = 0
    others = []
    for _ in range(6):  # the queue holds one while the first runs
        try:
            others.append(scheduler.submit(engine, layout, BlendConfig(mode="full"), GREEDY))
        except QueueFull as exc:
            assert "max_queue=1" in str(exc)
            refused += 1
    assert refused >= 1
    assert first.wait(60).finish_reason == "length"
    for h in others:
        assert len(h.wait(60).token_ids) == GREEDY.max_new_tokens
    scheduler.close()


def test_prompt_larger_than_the_pool_is_refused_with_numbers(engine):
    scheduler = Scheduler(engine.runner, ServingConfig(pool_tokens=64, block_tokens=16))
    layout = _layouts(engine)[0]
    with pytest.raises(PromptTooLarge, match=r"need \d+ blocks of 16 rows; the KV pool holds 4"):
        scheduler.submit(engine, layout, BlendConfig(mode="full"), GREEDY)
    assert scheduler.waiting == 0 and scheduler.pool.free_blocks == 4
    scheduler.close()


def test_timeout_fails_that_request_and_frees_its_blocks(engine):
    scheduler = Scheduler(engine.runner)
    layout = _layouts(engine)[0]
    slow = scheduler.submit(engine, layout, BlendConfig(mode="full"),
                            GenerationConfig(max_new_tokens=400, eos_token_ids=()),
                            timeout_s=0.001)  # past before its second token, whatever the speed
    fine = scheduler.submit(engine, layout, BlendConfig(mode="full"), GREEDY)
    with pytest.raises(RequestTimeout, match="timeout of 0.001 s"):
        slow.wait(60)
    assert len(fine.wait(60).token_ids) == GREEDY.max_new_tokens
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    assert scheduler.stats.timed_out == 1
    scheduler.close()


def test_cancelled_request_frees_its_pool_blocks(engine):
    scheduler = Scheduler(engine.runner)
    layout = _layouts(engine)[0]
    gen = GenerationConfig(max_new_tokens=400, eos_token_ids=())
    handle = scheduler.submit(engine, layout, BlendConfig(mode="full"), gen)
    stream = iter(handle)
    next(stream)  # running: it holds its blocks
    held = scheduler.pool.blocks - scheduler.pool.free_blocks
    assert held == scheduler.pool.blocks_for(layout.num_tokens + gen.max_new_tokens)
    handle.cancel()
    with pytest.raises(RequestCancelled):
        list(stream)
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    assert scheduler.stats.cancelled == 1 and scheduler.running == 0
    scheduler.close()


def test_a_client_that_goes_away_cancels_its_request(engine):
    scheduler = Scheduler(engine.runner)
    layout = _layouts(engine)[0]
    gen = GenerationConfig(max_new_tokens=400, eos_token_ids=())

    async def leave_early():
        handle = scheduler.submit(engine, layout, BlendConfig(mode="full"), gen)

        first = asyncio.Event()

        async def read():
            async for _ in handle:
                first.set()
        task = asyncio.create_task(read())
        await first.wait()  # decoding: then the client goes away
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return handle

    handle = asyncio.run(leave_early())
    assert handle.cancelled
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    scheduler.close()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_failing_request_fails_alone(engine, workers):
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=workers))
    layouts = _layouts(engine)

    def broken(_prefill):
        raise RuntimeError("planted")

    bad = scheduler.submit(engine, layouts[0], BlendConfig(mode="full"), GREEDY, prepare=broken)
    good = scheduler.submit(engine, layouts[1], BlendConfig(mode="full"), GREEDY)
    with pytest.raises(RuntimeError, match="planted"):
        bad.wait(60)
    assert len(good.wait(60).token_ids) == GREEDY.max_new_tokens
    _settle(scheduler)
    assert scheduler.pool.free_blocks == scheduler.pool.blocks
    scheduler.close()


def test_other_models_and_bad_configs_are_refused(engine, engine_for):
    scheduler = Scheduler(engine.runner)
    other = engine_for("qwen3")
    with pytest.raises(ValueError, match="another model"):
        scheduler.submit(other, other.build_prompt(PREFIX, PASSAGES, SUFFIX), BlendConfig(),
                         GREEDY)
    for bad in ({"max_seqs": 0}, {"max_queue": 1.5}, {"timeout_s": 0}, {"pool_tokens": 3},
                {"threads": 0}, {"idle_s": -1}, {"prefill_workers": -1},
                {"prefill_piece_tokens": 8}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServingConfig(**bad)
    scheduler.close()


def test_prefill_pieces_per_device_or_whole(engine):
    """None: pieces of 512 on a CPU, of 4096 on a GPU (a typical prompt whole); 0: whole."""
    from blendrag.serving import prefills

    assert prefills.default_piece_tokens(torch.device("cpu")) == 512
    assert prefills.default_piece_tokens(torch.device("cuda")) == 4096
    by_default, whole = Scheduler(engine.runner), Scheduler(
        engine.runner, ServingConfig(prefill_piece_tokens=0))
    for scheduler in (by_default, whole):  # as the decoding loop's thread asks
        scheduler._thread = threading.current_thread()
    assert by_default._pieces().tokens == 512
    assert whole._pieces() is None
    for scheduler in (by_default, whole):
        scheduler._thread = None
        scheduler.close()


def _settle(scheduler, timeout=10.0):
    """Wait until the scheduler holds no request."""
    end = time.monotonic() + timeout
    while (scheduler.running or scheduler.waiting) and time.monotonic() < end:
        time.sleep(0.02)


def test_the_shared_scheduler_does_not_keep_a_dropped_engine_alive(engine_for):
    import gc
    import weakref

    from blendrag.serving import scheduler_for

    engine = engine_for("llama")
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    scheduler_for(engine).submit(engine, layout, BlendConfig(mode="full"), GREEDY).wait(60)
    model = weakref.ref(engine.runner)
    scheduler_for(engine).close()
    del engine
    gc.collect()
    assert model() is None


def test_a_closed_shared_scheduler_is_replaced(engine):
    from blendrag.serving import scheduler_for

    first = scheduler_for(engine)
    first.close()
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    with pytest.raises(RuntimeError, match="closed"):
        first.submit(engine, layout, BlendConfig(mode="full"), GREEDY)
    second = scheduler_for(engine)
    assert second is not first
    assert len(second.submit(engine, layout, BlendConfig(mode="full"), GREEDY).wait(60)
               .token_ids) == GREEDY.max_new_tokens
    second.close()


def test_a_step_takes_the_prefill_workers_cores_while_they_idle(engine, monkeypatch):
    """On a CPU, a decoding step runs on the worker's cores too while no prefill runs (a step
    of a few requests is otherwise bound by one core), and on its own threads while one does;
    the answers stay those of each request alone."""
    from blendrag.serving import prefills, step

    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=1, threads=1))
    both = min(2, prefills.cores())
    assert scheduler._step_threads() == both
    scheduler._prefilling = 1
    assert scheduler._step_threads() == 1
    scheduler._prefilling = 0
    inline = Scheduler(engine.runner, ServingConfig(prefill_workers=0, threads=1))
    assert inline._step_threads() == 1
    inline.close()

    seen: list[int] = []
    batched = step.batched

    def counted(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return batched(*args, **kwargs)
    monkeypatch.setattr(step, "batched", counted)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    want = engine.generate(layout, BlendConfig(mode="reuse"), GREEDY).token_ids
    got = scheduler.submit(engine, layout, BlendConfig(mode="reuse"), GREEDY).wait(60)
    assert got.token_ids == want
    assert seen and set(seen) <= {1, both} and both in seen  # the steps once the prefill ran
    scheduler.close()
