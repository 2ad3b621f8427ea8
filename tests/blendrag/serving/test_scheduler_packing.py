"""Requests admitted together have their main passes packed into one forward
(``ServingConfig.pack_tokens``): each still gets its answer exactly as alone, with a prefill
worker or without, across namespaces; a request whose cached rows fail to load in the packed
forward retries and answers as alone; every slot and pool block is free after."""

from __future__ import annotations

import threading

import pytest

from blendrag import BlendConfig, GenerationConfig
from blendrag.engine.compute.observers import OFF
from blendrag.serving import Scheduler, ServingConfig
from blendrag.store.layered import LayerReadError
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

GREEDY = GenerationConfig(max_new_tokens=8, eos_token_ids=())
QUESTIONS = [SUFFIX, "\nQuestion: where were they born?\nAnswer:",
             "\nQuestion: which of the two was older?\nAnswer:",
             "\nQuestion: name both.\nAnswer:"]
CONFIGS = [BlendConfig(mode="reuse"), BlendConfig(mode="blend", ratio=0.3),
           BlendConfig(mode="blend", ratio=0.3, selector="cacheblend"), BlendConfig(mode="full")]


@pytest.fixture
def engine(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    return engine


def _submit_at_once(scheduler, requests):
    """Submit every request before the loop admits any: they are prefilled together."""
    with scheduler._cond:  # the loop waits for it to admit
        return [scheduler.submit(e, lay, blend, GREEDY) for e, lay, blend in requests]


def _free(scheduler) -> bool:
    slab = scheduler._slots.slab
    return (scheduler.pool.free_blocks == scheduler.pool.blocks
            and (slab is None or not slab.lent))


@pytest.mark.parametrize("workers", [0, 1])
def test_packed_prefills_answer_as_alone(engine, workers):
    layouts = [engine.build_prompt(PREFIX, PASSAGES[j % 3:], q) for j, q in enumerate(QUESTIONS)]
    want = [engine.generate(lay, c, GREEDY) for lay, c in zip(layouts, CONFIGS)]
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=workers,
                                                       pack_tokens=4096))
    handles = _submit_at_once(scheduler, [(engine, lay, c) for lay, c in zip(layouts, CONFIGS)])
    got = [h.wait(60) for h in handles]
    for a, b in zip(want, got):
        assert b.token_ids == a.token_ids and b.text == a.text
    packed = [h.prefill.stats.compute.packed_requests for h in handles if h.prefill]
    assert max(packed) >= 3 and scheduler.stats.packed >= 3
    assert _free(scheduler)
    scheduler.close()


def test_no_packing_when_off(engine):
    layouts = [engine.build_prompt(PREFIX, PASSAGES, q) for q in QUESTIONS[:2]]
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0, pack_tokens=0))
    handles = _submit_at_once(scheduler, [(engine, lay, CONFIGS[0]) for lay in layouts])
    for h in handles:
        h.wait(60)
        assert h.prefill is not None and h.prefill.stats.compute.packed_requests == 1
    assert scheduler.stats.packed == 0
    scheduler.close()


def test_namespaces_in_one_packed_pass_keep_their_own_rows(engine):
    tenant = engine.namespaced("tenant-a")
    tenant.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    reuse = CONFIGS[0]
    want = [e.generate(layout, reuse, GREEDY).token_ids for e in (engine, tenant)]
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0, pack_tokens=4096))
    handles = _submit_at_once(scheduler, [(e, layout, reuse) for e in (engine, tenant)])
    assert [h.wait(60).token_ids for h in handles] == want
    assert handles[1].result is not None
    assert handles[1].result.stats.cache.chunk_hits == len(PASSAGES)  # its own store's rows
    assert scheduler.stats.packed == 2
    scheduler.close()


def test_rows_failing_to_load_in_a_packed_pass_retry_alone(engine, monkeypatch):
    layouts = [engine.build_prompt(PREFIX, PASSAGES, q) for q in QUESTIONS[:3]]
    reuse = CONFIGS[0]
    want = [engine.generate(lay, reuse, GREEDY).token_ids for lay in layouts]
    real, made = engine.runner.feed, []

    def feed(segments, *args, **kw):  # the second feed made fails at layer 1
        f = real(segments, *args, **kw)
        made.append(f)
        if len(made) == 2:
            key, wait = segments[0].kv.key, f.wait

            def failing(i, clock=OFF):
                if i == 1:
                    raise LayerReadError(key, 1, "tier error (test)")
                return wait(i, clock)
            f.wait = failing
        return f
    monkeypatch.setattr(engine.runner, "feed", feed)
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0, pack_tokens=4096))
    handles = _submit_at_once(scheduler, [(engine, lay, reuse) for lay in layouts])
    assert [h.wait(60).token_ids for h in handles] == want
    retries = [h.prefill.stats.cache.load_retries for h in handles if h.prefill]
    assert sorted(retries) == [0, 0, 1]
    assert _free(scheduler)
    scheduler.close()


def test_an_idle_decoding_loop_prefills_beside_the_worker(engine):
    """With nothing to decode, the decoding loop's core would idle while the worker prefills:
    of two requests arriving together on a CPU, the loop prefills one itself (the first's
    prefill cannot finish until the second's has run, so one worker alone would time out)."""
    layouts = [engine.build_prompt(PREFIX, PASSAGES, q) for q in QUESTIONS[:2]]
    reuse = CONFIGS[0]
    want = [engine.generate(lay, reuse, GREEDY).token_ids for lay in layouts]
    second = threading.Event()
    threads: list[str] = []

    def first(_prefill) -> None:
        threads.append(threading.current_thread().name)
        if not second.wait(30):
            raise TimeoutError("the second request was not prefilled beside the first")

    def other(_prefill) -> None:
        threads.append(threading.current_thread().name)
        second.set()

    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=1, pack_tokens=0))
    with scheduler._cond:
        handles = [scheduler.submit(engine, layouts[0], reuse, GREEDY, prepare=first),
                   scheduler.submit(engine, layouts[1], reuse, GREEDY, prepare=other)]
    assert [h.wait(60).token_ids for h in handles] == want
    assert len(set(threads)) == 2 and any("prefill" in name for name in threads)
    assert _free(scheduler)
    scheduler.close()
