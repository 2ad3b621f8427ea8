"""The scheduler's slab after ``release_buffers``: a runner drops the slabs no served request
holds a slot of, and the scheduler's next request is lent a slot of the runner's slab (made
again), never one of the dropped slab that the runner's batched step no longer knows."""

from __future__ import annotations

from blendrag import BlendConfig, GenerationConfig
from blendrag.serving import Scheduler, ServingConfig
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

GREEDY = GenerationConfig(max_new_tokens=6, eos_token_ids=())


def test_requests_after_release_buffers_decode_in_the_runners_slab(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    blend = BlendConfig(mode="blend", ratio=0.3)
    want = engine.generate(layout, blend, GREEDY)
    scheduler = Scheduler(engine.runner, ServingConfig(prefill_workers=0))
    try:
        first = scheduler.submit(engine, layout, blend, GREEDY).wait(60)
        slab = scheduler._slots.slab
        assert slab is not None and not slab.lent  # its slot given back
        engine.release_buffers()  # the idle slab goes
        handles = [scheduler.submit(engine, layout, blend, GREEDY) for _ in range(2)]
        again = [h.wait(60) for h in handles]
        now = scheduler._slots.slab
        assert now is not None and now is not slab
        assert engine.runner.slab_step(now).slab is now  # the runner's own: its step runs
        for got in (first, *again):
            assert got.token_ids == want.token_ids and got.text == want.text
        assert scheduler.pool.free_blocks == scheduler.pool.blocks
    finally:
        scheduler.close()
