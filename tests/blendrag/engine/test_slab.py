"""The KV slab (engine/compute/slab.py) and its batched step (engine/compute/slab_step.py):
requests prefilled into slots and decoded together get the logits of their own steps alone
(fp32 within 1e-4, the same greedy tokens) for every family's attention and RoPE; padding
rows write only the scratch slot; a slot that is not decoding (free, or another request's,
even one holding NaNs) changes no request's logits; a slot lent again keeps no row of its
last request; a served request's KV lets go of its slot's rows once it is done."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.engine.compute.slab import KVSlab
from blendrag.engine.compute.slab_step import batch_bucket
from blendrag.serving import Scheduler, ServingConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX, decoded_alone

STEPS = 6
GEN = GenerationConfig(max_new_tokens=STEPS + 1, eos_token_ids=())
REQUESTS = (  # (slot, passages, mode): slot 1 left out (padding), lengths and modes differ
    (0, PASSAGES, BlendConfig(mode="full")),
    (2, PASSAGES[:2], BlendConfig(mode="blend", ratio=0.3)),
    (3, PASSAGES[1:], BlendConfig(mode="reuse")),
)
FAMILIES = {
    "llama": {}, "mistral": {"sliding_window": 24}, "qwen3": {}, "gemma2": {},
    "gemma3": {}, "phi3": {}, "olmo2": {},
}


def _greedy(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def _alone(engine) -> list[list[torch.Tensor]]:
    pres = [engine.prefill(engine.build_prompt(PREFIX, passages, SUFFIX), config,
                           extra_capacity=STEPS + 1) for _, passages, config in REQUESTS]
    return decoded_alone(engine, pres, STEPS)


def _into(slab: KVSlab, slot: int, pre):
    """``pre``'s rows moved into ``slot``, as the scheduler moves a request's after its
    prefill."""
    pre.fused.move_to(slab.view(slot, pre.fused.capacity))
    return pre


def _in_slots(engine, slab: KVSlab):
    """The requests prefilled, then moved into their slots (claimed lowest first: slot 1 too,
    then given back) -> their prefills."""
    claimed = [slab.claim() for _ in range(4)]
    assert claimed == [0, 1, 2, 3]
    slab.release(1)
    return [_into(slab, slot, engine.prefill(engine.build_prompt(PREFIX, passages, SUFFIX),
                                             config, extra_capacity=STEPS + 1))
            for slot, passages, config in REQUESTS]


def _together(engine, slab: KVSlab, pres) -> list[list[torch.Tensor]]:
    slots = [slot for slot, _, _ in REQUESTS]
    tokens = [_greedy(pre.logits) for pre in pres]
    runs: list[list[torch.Tensor]] = [[] for _ in pres]
    for _ in range(STEPS):
        out = engine.runner.decode_slab(slab, tokens, slots, [pre.fused for pre in pres])
        for j, row in enumerate(out):
            runs[j].append(row)
        tokens = [_greedy(row) for row in out]
    return runs


@pytest.mark.parametrize("family", list(FAMILIES))
def test_slab_step_gives_each_request_its_own_logits(engine_for, family):
    engine = engine_for(family, **FAMILIES[family])
    engine.ingest(PASSAGES, PREFIX)
    alone = _alone(engine)
    slab = engine.runner.slab(4, 256)
    assert slab is not None
    pres = _in_slots(engine, slab)
    for mine, theirs in zip(alone, _together(engine, slab, pres)):
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, atol=1e-4, rtol=0), (a - b).abs().max()
            assert _greedy(a) == _greedy(b)


def test_padding_writes_only_the_scratch_slot_and_other_slots_change_nothing(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    alone = _alone(engine)
    slab = engine.runner.slab(4, 256)
    assert slab is not None
    pres = _in_slots(engine, slab)
    # slot 1 is free; fill it with NaN, as a slot of garbage would be: its padding row reads it
    slab.k[1].fill_(float("nan"))
    slab.v[1].fill_(float("nan"))
    before = slab.k[1].clone()
    for mine, theirs in zip(alone, _together(engine, slab, pres)):
        for a, b in zip(mine, theirs):
            assert torch.allclose(a, b, atol=1e-4, rtol=0)
    assert torch.equal(slab.k[1].isnan(), before.isnan())  # nothing written into slot 1
    # the padding row's keys went to the scratch slot: from its second layer on, NaN (its
    # first layer attended over slot 1's NaN rows), and no request's row read them
    assert slab.k[slab.scratch, 1:, :, 0].isnan().all()


def test_step_is_refused_for_views_that_are_not_its_slots(engine_for):
    engine = engine_for("llama")
    slab = engine.runner.slab(2, 128)
    assert slab is not None
    pre = engine.prefill(engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
                         BlendConfig(mode="full"), extra_capacity=4)
    with pytest.raises(ValueError, match="not the view of slot 0"):
        engine.runner.decode_slab(slab, [1], [0], [pre.fused])
    view = slab.view(slab.claim() or 0, 64)
    with pytest.raises(ValueError, match="share a slot"):
        engine.runner.decode_slab(slab, [1, 2], [0, 0], [view, view])


def test_slots_are_lent_lowest_first_and_given_back_once():
    slab = KVSlab(3, 32, layers=2, kv_heads=1, head_dim=4, dtype=torch.float32,
                  device=torch.device("cpu"))
    assert [slab.claim(), slab.claim(), slab.claim(), slab.claim()] == [0, 1, 2, None]
    slab.release(1)
    with pytest.raises(ValueError, match="slot 1 is not lent"):
        slab.release(1)
    assert slab.claim() == 1
    assert not slab.fits(33) and slab.fits(32)
    with pytest.raises(ValueError, match="does not fit a slot of 32"):
        slab.view(0, 33)
    assert torch.equal(slab.k[:3], torch.zeros_like(slab.k[:3]))  # zeroed when first lent
    with pytest.raises(ValueError, match=">= 1 slot"):
        KVSlab(0, 32, 2, 1, 4, torch.float32, torch.device("cpu"))


def test_a_slab_is_retired_only_while_no_slot_is_lent_and_then_lends_none():
    # the runner lets an idle slab go (release_buffers): checked and marked at once, so a
    # scheduler's claim never gets a slot of a slab the runner no longer steps
    slab = KVSlab(2, 32, layers=2, kv_heads=1, head_dim=4, dtype=torch.float32,
                  device=torch.device("cpu"))
    slot = slab.claim()
    assert slot == 0 and not slab.retire() and not slab.retired
    slab.release(slot)
    assert slab.retire() and slab.retired
    assert slab.claim() is None and slab.free_slots == 2


def test_batch_buckets():
    assert [batch_bucket(n, 16) for n in (1, 2, 3, 4, 5, 9, 16)] == [1, 2, 4, 4, 8, 16, 16]
    assert batch_bucket(5, 6) == 6


def test_a_slot_lent_again_keeps_no_row_of_its_last_request(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    slab = engine.runner.slab(2, 256)
    assert slab is not None
    slot = slab.claim() or 0
    long = _into(slab, slot, engine.prefill(engine.build_prompt(PREFIX, PASSAGES, SUFFIX),
                                            BlendConfig(), extra_capacity=8))
    n_long = long.fused.length
    long.fused.forget()  # done: its Prefill holds no row of the slot any more
    assert long.fused.capacity == 0 and long.fused.base[0].shape[2] == 0
    short = engine.prefill(engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
                           BlendConfig(mode="reuse"), extra_capacity=8)
    want = short.fused.k[:, :, :short.fused.length].clone()
    _into(slab, slot, short)
    n = short.fused.length
    assert n < n_long
    k, v = short.fused.base
    assert k.data_ptr() == slab.k[slot].data_ptr()
    assert torch.equal(k[:, :, :n], want)  # its rows moved in
    assert k[:, :, n:n_long].abs().sum() == 0 and v[:, :, n:n_long].abs().sum() == 0
    with pytest.raises(ValueError, match="do not fit"):
        short.fused.move_to(slab.view(1, 16))


def test_served_requests_decode_in_the_slab_and_let_go_of_its_rows(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = [engine.build_prompt(PREFIX, p, SUFFIX) for _, p, _ in REQUESTS]
    want = [engine.generate(lay, config, GEN) for lay, (_, _, config) in zip(layouts, REQUESTS)]
    scheduler = Scheduler(engine.runner, ServingConfig(max_seqs=4, slot_tokens=256,
                                                       prefill_workers=0))
    handles = [scheduler.submit(engine, lay, config, GEN)
               for lay, (_, _, config) in zip(layouts, REQUESTS)]
    got = [h.wait(60) for h in handles]
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    slab = engine.runner.slab(4, 256)
    assert slab is not None
    assert engine.runner.slab_step(slab).shapes >= 1 and scheduler.stats.mean_batch > 1.5
    assert slab.free_slots == slab.slots
    for h in handles:  # the slot is another request's now: its Prefill holds no row of it
        assert h.prefill is not None and h.prefill.fused.capacity == 0
    scheduler.close()


def test_requests_longer_than_a_slot_take_buffers_of_their_own(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = [engine.build_prompt(PREFIX, p, SUFFIX) for _, p, _ in REQUESTS]
    want = [engine.generate(lay, config, GEN) for lay, (_, _, config) in zip(layouts, REQUESTS)]
    rows = min(lay.num_tokens for lay in layouts) + GEN.max_new_tokens
    # the shortest fits a slot, the others do not: both kinds decode in one turn
    scheduler = Scheduler(engine.runner, ServingConfig(slot_tokens=rows, prefill_workers=0))
    handles = [scheduler.submit(engine, lay, config, GEN)
               for lay, (_, _, config) in zip(layouts, REQUESTS)]
    assert [h.wait(60).token_ids for h in handles] == [w.token_ids for w in want]
    slab = engine.runner.slab(ServingConfig().max_seqs, rows)
    assert slab is not None and engine.runner.slab_step(slab).shapes >= 1
    scheduler.close()


def test_no_slab_for_dynamic_rope_nor_when_turned_off(engine_for, monkeypatch):
    engine = engine_for("llama", rope={"rope_type": "dynamic", "factor": 2.0})
    assert engine.runner.slab(2, 64) is None
    engine = engine_for("llama")
    asked = []
    monkeypatch.setattr(engine.runner, "slab", lambda *a: asked.append(a))
    scheduler = Scheduler(engine.runner, ServingConfig(slot_tokens=0))
    handle = scheduler.submit(engine, engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
                              BlendConfig(mode="full"), GEN)
    handle.wait(60)
    assert asked == []
    scheduler.close()
    with pytest.raises(ValueError, match="slot_tokens"):
        ServingConfig(slot_tokens=-1)



def test_no_memory_for_a_slab_serves_from_own_buffers(engine_for, monkeypatch, caplog):
    engine = engine_for("llama")

    def no_memory(slots, rows):
        raise torch.OutOfMemoryError(f"{slots} x {rows} rows")

    monkeypatch.setattr(engine.runner, "slab", no_memory)
    layout = engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX)
    want = engine.generate(layout, BlendConfig(mode="full"), GEN)
    scheduler = Scheduler(engine.runner, ServingConfig(slot_tokens=256))
    handles = [scheduler.submit(engine, layout, BlendConfig(mode="full"), GEN) for _ in range(2)]
    assert [h.wait(60).token_ids for h in handles] == [want.token_ids] * 2
    assert "no KV slab" in caplog.text
    scheduler.close()


def test_a_request_failing_after_its_rows_moved_in_lets_go_of_its_slot(engine_for):
    engine = engine_for("llama")
    scheduler = Scheduler(engine.runner, ServingConfig(max_seqs=2, slot_tokens=256,
                                                       prefill_workers=0))

    def fails(pre):
        raise RuntimeError("the caller's hook failed")

    handle = scheduler.submit(engine, engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
                              BlendConfig(mode="full"), GEN, prepare=fails)
    with pytest.raises(RuntimeError, match="hook failed"):
        handle.wait(60)
    slab = engine.runner.slab(2, 256)
    assert slab is not None and slab.free_slots == 2
    assert handle.prefill is not None and handle.prefill.fused.capacity == 0
    scheduler.close()


def test_closing_while_a_worker_prefills_frees_its_slot_and_fails_it(engine_for):
    engine = engine_for("llama")
    scheduler = Scheduler(engine.runner, ServingConfig(max_seqs=2, slot_tokens=256,
                                                       prefill_workers=1))
    started = threading.Event()

    def slow(pre):
        started.set()
        time.sleep(0.5)  # close() runs meanwhile

    handle = scheduler.submit(engine, engine.build_prompt(PREFIX, PASSAGES[:1], SUFFIX),
                              BlendConfig(mode="full"), GEN, prepare=slow)
    assert started.wait(60)
    scheduler.close()
    with pytest.raises(RuntimeError, match="closed"):
        handle.wait(5)
    slab = engine.runner.slab(2, 256)
    assert slab is not None and slab.free_slots == 2
    assert scheduler.pool.free_blocks == scheduler.pool.blocks


def test_two_schedulers_on_one_model_share_its_slab_or_keep_their_own_buffers(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = [engine.build_prompt(PREFIX, p, SUFFIX) for _, p, _ in REQUESTS]
    want = [engine.generate(lay, config, GEN).token_ids
            for lay, (_, _, config) in zip(layouts, REQUESTS)]
    same = ServingConfig(max_seqs=4, slot_tokens=256)
    first, second = Scheduler(engine.runner, same), Scheduler(engine.runner, same)
    other = Scheduler(engine.runner, ServingConfig(max_seqs=2, slot_tokens=512))
    handles = [s.submit(engine, lay, config, GEN) for s in (first, second, other)
               for lay, (_, _, config) in zip(layouts, REQUESTS)]
    got = [h.wait(60).token_ids for h in handles]
    assert got == want * 3  # from two threads at once over one slab, and beside it
    for s in (first, second, other):
        s.close()


def test_one_slab_per_dimensions_and_released_once_no_slot_is_lent(engine_for):
    engine = engine_for("llama")
    slab = engine.runner.slab(2, 64)
    assert slab is not None
    slot = slab.claim()
    other = engine.runner.slab(4, 64)
    assert other is not None and other is not slab and engine.runner.slab(2, 64) is slab
    engine.runner.release_buffers()  # slab has a slot lent: kept; the other is dropped
    assert engine.runner.slab(2, 64) is slab and engine.runner.slab(4, 64) is not other
    with pytest.raises(ValueError, match="not this runner's"):
        engine.runner.slab_step(other)
    slab.release(slot or 0)
