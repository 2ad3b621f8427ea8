"""Several requests' prefills with their main passes packed into one forward
(engine/request/packing.py, engine/compute/packed.py): each request's first-token logits and
request KV match its prefill alone (fp32, 1e-4 and 1e-5) for every family and every mode and
selector, with prompts of different lengths and modes side by side; the packed passes really
ran as one forward; a request whose cached rows fail to load in the packed forward retries and
still answers as alone while the others are untouched; a request that fails to start fails
alone; the passes that do not pack run alone."""

from __future__ import annotations

import pytest
import torch

from blendrag import BlendConfig, GenerationConfig
from blendrag.config import Ape
from blendrag.engine.compute.observers import OFF, CapturedRows, KeyAttention, PhaseClock
from blendrag.engine.compute.pieces import PrefillPieces
from blendrag.engine.request import packing
from blendrag.engine.request.prefill import Prefill
from blendrag.store.layered import LayerReadError
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

GEN = GenerationConfig(max_new_tokens=1)
CONFIGS = {
    "full": BlendConfig(mode="full"),
    "reuse": BlendConfig(mode="reuse"),
    "prefix": BlendConfig(mode="prefix"),
    "blend": BlendConfig(mode="blend", ratio=0.3),  # the default selector: preview
    "cacheblend": BlendConfig(mode="blend", ratio=0.3, selector="cacheblend"),  # check layers
    "ape": BlendConfig(mode="reuse", ape=Ape()),
}
QUESTIONS = [SUFFIX, "\nQuestion: where were they born?\nAnswer:",
             "\nQuestion: which of the two was older, and by how many years?\nAnswer:"]


def _layouts(engine):
    """Three prompts of different lengths over different chunks."""
    return [engine.build_prompt(PREFIX, PASSAGES, QUESTIONS[0]),
            engine.build_prompt(PREFIX, PASSAGES[:2], QUESTIONS[1]),
            engine.build_prompt(PREFIX, PASSAGES[::-1], QUESTIONS[2])]


def _together(engine, layouts, configs, max_tokens=4096) -> list:
    steps = [engine.stream_steps(layout, config, GEN) for layout, config in zip(layouts, configs)]
    return packing.run_together(engine.runner, steps, max_tokens)


def _same(packed: Prefill, alone: Prefill) -> None:
    assert torch.allclose(packed.logits, alone.logits, atol=1e-4, rtol=0)
    n = alone.fused.length
    assert packed.fused.length == n
    assert torch.allclose(packed.fused.k[:, :, :n], alone.fused.k[:, :, :n], atol=1e-5, rtol=0)
    assert torch.allclose(packed.fused.v[:, :, :n], alone.fused.v[:, :, :n], atol=1e-5, rtol=0)
    assert packed.stats.compute.computed_per_layer == alone.stats.compute.computed_per_layer


def _packed_forwards(monkeypatch, engine) -> list[int]:
    """Record the lanes of every packed forward the runner runs."""
    calls: list[int] = []
    real = engine.runner.run_packed

    def spy(lanes):
        calls.append(len(lanes))
        return real(lanes)
    monkeypatch.setattr(engine.runner, "run_packed", spy)
    return calls


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2", "phi3"])
@pytest.mark.parametrize("mode", list(CONFIGS))
def test_packed_prefills_equal_each_prefill_alone(engine_for, monkeypatch, family, mode):
    engine = engine_for(family)
    if mode == "ape" and engine.adapter.attn_softcap is not None:
        pytest.skip("APE does not run on soft-capped attention (Gemma 2)")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    config = CONFIGS[mode]
    alone = [engine.prefill(layout, config, GEN.max_new_tokens) for layout in layouts]
    calls = _packed_forwards(monkeypatch, engine)
    streams = _together(engine, layouts, [config] * 3)
    assert calls == ([3, 3] if mode == "blend" else [3])  # blend's preview passes too
    for stream, one in zip(streams, alone):
        _same(stream.prefill, one)
        assert stream.prefill.stats.compute.packed_requests == 3
        assert stream.prefill.stats.compute.preview_attended_keys == \
            one.stats.compute.preview_attended_keys


def test_requests_of_different_modes_and_lengths_pack_together(engine_for, monkeypatch):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    configs = [CONFIGS["reuse"], CONFIGS["cacheblend"], CONFIGS["full"]]
    alone = [engine.prefill(lay, c, GEN.max_new_tokens) for lay, c in zip(layouts, configs)]
    calls = _packed_forwards(monkeypatch, engine)
    streams = _together(engine, layouts, configs)
    assert calls == [3]
    assert [s.prefill.stats.timing.waited_s >= 0 for s in streams] == [True] * 3
    for stream, one in zip(streams, alone):
        _same(stream.prefill, one)
        assert int(stream.prefill.logits.argmax()) == int(one.logits.argmax())


def test_a_request_whose_rows_fail_to_load_retries_and_the_others_are_untouched(
        engine_for, monkeypatch):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    alone = [engine.prefill(lay, CONFIGS["reuse"], GEN.max_new_tokens) for lay in layouts]
    calls = _packed_forwards(monkeypatch, engine)
    real = engine.runner.feed
    made, fail_at = [], [2]

    def feed(segments, *args, **kw):  # the ``fail_at``-th feed made fails at layer 1
        f = real(segments, *args, **kw)
        made.append(f)
        if len(made) == fail_at[0]:
            key = segments[0].kv.key
            wait = f.wait

            def failing(i, clock=OFF):
                if i == 1:
                    raise LayerReadError(key, 1, "tier error (test)")
                return wait(i, clock)
            f.wait = failing
        return f
    monkeypatch.setattr(engine.runner, "feed", feed)
    streams = _together(engine, layouts, [CONFIGS["reuse"]] * 3)
    assert calls == [3]  # the retry ran alone, after the packed forward
    assert streams[1].prefill.stats.cache.load_retries == 1
    for j in (0, 2):
        _same(streams[j].prefill, alone[j])
    # the second request as it runs alone with the same failure: the same retry, the same rows
    made.clear()
    fail_at[0] = 1
    retried = engine.prefill(layouts[1], CONFIGS["reuse"], GEN.max_new_tokens)
    assert retried.stats.cache.load_retries == 1
    _same(streams[1].prefill, retried)


def test_a_request_that_fails_to_start_fails_alone(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    too_long = engine.build_prompt(PREFIX, PASSAGES * 200, SUFFIX)
    out = _together(engine, [layouts[0], too_long, layouts[1]], [CONFIGS["reuse"]] * 3)
    assert isinstance(out[1], ValueError)
    alone = engine.prefill(layouts[1], CONFIGS["reuse"], GEN.max_new_tokens)
    _same(out[2].prefill, alone)


def test_passes_that_do_not_pack_run_alone(engine_for, monkeypatch):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layout = _layouts(engine)[0]
    steps = [engine.stream_steps(layout, CONFIGS["reuse"], GEN) for _ in range(2)]
    mains = [next(s) for s in steps]
    assert all(packing.packable(m) for m in mains)
    for s in steps:
        s.close()
    timed = engine._prefill_steps(layout, CONFIGS["reuse"], 1, (PhaseClock(engine.device),))
    assert not packing.packable(next(timed))
    timed.close()
    scored = engine._prefill_steps(layout, CONFIGS["reuse"], 1, (KeyAttention(0, 4),))
    assert packing.packable(next(scored))  # its scores computed per request, as alone
    scored.close()
    long = engine._prefill_steps(layout, CONFIGS["full"], 1,
                                 pieces=PrefillPieces(16, lambda: None))
    assert not packing.packable(next(long))  # runs in pieces
    long.close()
    calls = _packed_forwards(monkeypatch, engine)
    # a token budget of one request's pass: each alone
    out = _together(engine, [layout] * 2, [CONFIGS["reuse"]] * 2, max_tokens=1)
    assert calls == []
    alone = engine.prefill(layout, CONFIGS["reuse"], 1)
    for stream in out:
        _same(stream.prefill, alone)


def test_observers_see_every_layer_of_a_packed_pass(engine_for):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    rows = [CapturedRows(), CapturedRows()]
    steps = [engine._prefill_steps(lay, CONFIGS["reuse"], 1, (r,))
             for lay, r in zip(layouts[:2], rows)]
    out = packing.run_together(engine.runner, steps, 4096)
    for pre, r, lay in zip(out, rows, layouts[:2]):
        assert isinstance(pre, Prefill)
        computed = pre.stats.compute.computed_per_layer[0]
        assert r.keys.shape[0] == engine.adapter.num_layers
        assert r.keys.shape[2] == computed == len(lay.suffix_ids)


def test_each_request_has_its_result_as_soon_as_its_pass_ran(engine_for, monkeypatch):
    engine = engine_for("llama")
    engine.ingest(PASSAGES, PREFIX)
    layouts = _layouts(engine)
    events: list = []
    packed, alone = engine.runner.run_packed, engine.runner.run
    monkeypatch.setattr(engine.runner, "run_packed",
                        lambda lanes: events.append("packed") or packed(lanes))
    monkeypatch.setattr(engine.runner, "run",
                        lambda *a, **kw: events.append("alone") or alone(*a, **kw))
    steps = [engine.stream_steps(layouts[0], CONFIGS["reuse"], GEN),
             engine.stream_steps(layouts[1], CONFIGS["reuse"], GEN),
             engine.stream_steps(layouts[2], CONFIGS["full"], GEN,  # in pieces: alone
                                 pieces=PrefillPieces(16, lambda: None))]
    out = packing.run_together(engine.runner, steps, 4096,
                               on_result=lambda j, _: events.append(j))
    assert events == ["packed", 0, 1, "alone", 2]
    assert [o.prefill.stats.compute.packed_requests for o in out] == [2, 2, 1]
