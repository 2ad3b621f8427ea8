"""The device's cost profile (engine/selection/costs.py) and a request run as a full prefill when
the
profile predicts its mode slower (``LoadingConfig.full_when_faster``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from blendrag import BlendConfig, BlendEngine, ComputeConfig
from blendrag.engine.caches.context import NO_CONTEXT
from blendrag.engine.request.stats import ModeChoice, RequestStats, TimingStats
from blendrag.engine.selection.controller import LoadingConfig
from blendrag.engine.selection.costs import (
    DeviceCosts,
    PassCost,
    PromptShape,
    _fit,
    observe_choice,
)
from helpers.tiny import PASSAGES, PREFIX, SUFFIX

FULL = BlendConfig(mode="full")


def test_the_fit_recovers_a_pass_cost():
    true = PassCost(2e-4, 3e-6, 5e-9)
    rows = [(t, p, true.seconds(t, p)) for t, p in [(64, 20_000), (512, 1e5), (1024, 6e5),
                                                      (2048, 2e6)]]
    got = _fit(rows)
    assert got.a == pytest.approx(true.a, rel=1e-6)
    assert got.b == pytest.approx(true.b, rel=1e-6)
    assert got.c == pytest.approx(true.c, rel=1e-6)


def test_predictions_follow_the_work_of_each_mode():
    costs = DeviceCosts(32, {k: PassCost(1e-4, 1e-6, 1e-9) for k in ("causal", "tail",
                                                                      "scattered")})
    shape = PromptShape(n=3168, prefix=32, chunks=3072, suffix=64, first_chunk_end=544)
    full = costs.predict(FULL, shape)
    reuse = costs.predict(BlendConfig(mode="reuse"), shape)
    epic = costs.predict(BlendConfig(selector="epic", ratio=0.15), shape)
    preview = costs.predict(BlendConfig(selector="preview", ratio=0.15), shape)
    cacheblend = costs.predict(BlendConfig(selector="cacheblend", ratio=0.15), shape)
    assert reuse < epic < preview < full and epic < cacheblend < full
    # the preview pass is reuse's pass; a check layer costs what a full layer costs
    assert preview - epic == pytest.approx(reuse)
    assert cacheblend - epic == pytest.approx(2 * (full - epic) / 32)
    # what the store misses is computed first: causal passes of the lengths given
    missing = PromptShape(3168, 32, 3072, 64, 544, miss_passes=(544,) * 6)
    extra = 6 * costs.pass_s("causal", 544, 544 * 545 / 2)
    assert costs.predict(BlendConfig(mode="reuse"), missing) == pytest.approx(reuse + extra)


def engine_with(model_dir, costs: DeviceCosts, enabled: bool | None,
                compute: ComputeConfig | None = None) -> BlendEngine:
    engine = BlendEngine.from_pretrained(model_dir("llama"), device="cpu", chat=False,
                                         context=NO_CONTEXT,
                                         loading=LoadingConfig(full_when_faster=enabled),
                                         compute=compute or ComputeConfig())
    engine.runner.cost_profile = costs
    return engine


def test_a_mode_predicted_slower_runs_as_an_exact_full_prefill(model_dir):
    # a device where every cached pass costs 50 ms a layer: no cached mode can win
    slow = DeviceCosts(3, {"causal": PassCost(1e-3, 1e-6, 0), "tail": PassCost(5e-2, 0, 0),
                           "scattered": PassCost(5e-2, 0, 0)})
    engine = engine_with(model_dir, slow, True)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    full = engine.prefill(layout, FULL)
    for config in (BlendConfig(), BlendConfig(mode="reuse"), BlendConfig(mode="prefix")):
        pre = engine.prefill(layout, config)
        assert torch.equal(pre.logits, full.logits), config.label
        assert pre.stats.mode == "full"
        choice = pre.stats.controller.mode
        assert (choice.asked, choice.ran) == (config.label, "full")
        assert choice.predicted_s > choice.full_predicted_s
    # where a cached mode is predicted faster, it runs
    fast = DeviceCosts(3, {"causal": PassCost(5e-2, 1e-6, 0), "tail": PassCost(1e-3, 0, 0),
                           "scattered": PassCost(1e-3, 0, 0)})
    engine.runner.cost_profile = fast
    pre = engine.prefill(layout, BlendConfig())
    assert pre.stats.mode == "blend" and pre.stats.controller.mode.ran == "blend-preview@0.2"
    assert not torch.equal(pre.logits, full.logits)


def test_what_a_mode_takes_beyond_its_passes_is_measured_and_counts():
    costs = DeviceCosts(2, {k: PassCost(1e-3, 0, 0) for k in ("causal", "tail", "scattered")})
    costs.observe("reuse", 0.010, 0.500)  # the first request: kernels compiled
    assert costs.overhead("reuse") == 0.0  # not before TRIALS requests
    costs.observe("reuse", 0.010, 0.040)
    costs.observe("reuse", 0.010, 0.090)  # a slow outlier never counts against the mode
    assert costs.overhead("reuse") == pytest.approx(0.030)
    assert costs.overhead("full") == 0.0


def _timed(work_s: float, **compute) -> RequestStats:
    stats = RequestStats(mode="reuse", timing=TimingStats(fetch_s=work_s / 2,
                                                          prefill_s=work_s / 2))
    stats.compute = dataclasses.replace(stats.compute, **compute)
    return stats


def test_only_requests_alone_at_their_steady_state_are_measured():
    costs = DeviceCosts(2, {k: PassCost(1e-3, 0, 0) for k in ("causal", "tail", "scattered")})
    choice = ModeChoice("reuse", "reuse", 0.0, 0.0, 0.010, 0.050, 0)
    # a pass captured now, or seen once and run by the layer loop: far slower than a replay
    observe_choice(costs, choice, _timed(0.500, warming_passes=1))
    observe_choice(costs, choice, _timed(0.400, warming_passes=2))
    observe_choice(costs, choice, _timed(0.300, packed_requests=3))  # its pass time shared
    assert costs.overhead("reuse") == 0.0 and "reuse" not in costs._gaps
    # its own work: no time queued, none left to the requests served beside it
    beside = _timed(0.060)
    beside.timing.waited_s, beside.timing.between_pieces_s = 0.010, 0.020
    beside.timing.ttft_s = 2.0  # it queued behind others first
    observe_choice(costs, choice, beside)
    observe_choice(costs, choice, _timed(0.045))
    assert costs.overhead("reuse") == pytest.approx(0.020)  # 0.030 of work, 0.010 predicted
    ran_full = ModeChoice("reuse", "full", 0.0, 0.0, 0.010, 0.050, 0)
    observe_choice(costs, ran_full, _timed(0.070))  # measured against full's passes
    observe_choice(costs, ran_full, _timed(0.080))
    assert costs.overhead("full") == pytest.approx(0.020)


def test_the_first_passes_of_a_shape_teach_the_profile_nothing(model_dir):
    """A captured pass's shape seen the first time runs the layer loop (on CUDA; here the
    static pass is told to wait once, as it does there): that request is warming, not
    measured; the next one is."""
    free = DeviceCosts(3, {"causal": PassCost(2e-6, 0, 0), "tail": PassCost(1e-6, 0, 0),
                           "scattered": PassCost(1e-6, 0, 0)})
    engine = engine_with(model_dir, free, True, ComputeConfig(passes="graph"))
    passes = engine.runner.static_passes
    assert passes is not None
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    replay, seen = passes.run, []

    def first_twice_none(*args):  # as on CUDA: the loop, then a capture
        seen.append(1)
        return None if len(seen) == 1 else replay(*args)

    passes.run = first_twice_none  # type: ignore[method-assign]
    config = BlendConfig(mode="reuse")
    first = engine.prefill(layout, config)
    assert first.stats.compute.warming_passes == 1 and first.stats.mode == "reuse"
    assert "reuse" not in free._gaps
    second = engine.prefill(layout, config)  # the static pass: its steady state, measured
    assert second.stats.compute.warming_passes == 0
    assert free._gaps["reuse"][0] == 1
    assert torch.allclose(first.logits, second.logits, atol=1e-5, rtol=0)


def test_a_mode_measured_slower_than_its_passes_predict_then_runs_full(model_dir):
    # passes that predict every mode nearly free: only the requests' own times tell
    free = DeviceCosts(3, {"causal": PassCost(2e-6, 0, 0), "tail": PassCost(1e-6, 0, 0),
                           "scattered": PassCost(1e-6, 0, 0)})
    engine = engine_with(model_dir, free, True)
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    engine.ingest(PASSAGES, prefix=PREFIX)
    full = engine.prefill(layout, FULL).logits
    config = BlendConfig(mode="reuse")
    ran = [engine.prefill(layout, config).stats.controller.mode for _ in range(3)]
    assert [r.ran for r in ran] == ["reuse", "reuse", "full"]
    assert ran[2].predicted_s > ran[2].passes_s + 1e-4  # the measured overhead counted
    assert torch.equal(engine.prefill(layout, config).logits, full)  # exact, as full


def test_off_on_a_cpu_by_default_and_when_asked(model_dir):
    slow = DeviceCosts(3, {"causal": PassCost(1e-3, 0, 0), "tail": PassCost(1.0, 0, 0),
                           "scattered": PassCost(1.0, 0, 0)})
    for enabled in (None, False):  # None: CUDA devices only
        engine = engine_with(model_dir, slow, enabled)
        engine.ingest(PASSAGES, prefix=PREFIX)  # none missing: the profile alone would decide
        layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
        pre = engine.prefill(layout, BlendConfig())
        assert pre.stats.mode == "blend" and pre.stats.controller.mode is None


def test_missing_chunks_are_counted_before_any_is_computed(model_dir):
    engine = engine_with(model_dir, DeviceCosts(3, {}), False)  # no ingestion context
    layout = engine.build_prompt(PREFIX, PASSAGES, SUFFIX)
    config = BlendConfig(mode="reuse")
    p = len(layout.prefix_ids)
    every = [p] + [p + len(c) for c in layout.chunk_ids]
    assert engine.cache.miss_passes(layout, config) == every
    engine.ingest(PASSAGES[:2], prefix=PREFIX)  # the prefix and two chunks stored
    assert engine.cache.miss_passes(layout, config) == every[3:]
    assert engine.cache.miss_passes(layout, FULL) == []


def test_a_chunk_in_an_ingestion_context_costs_a_pass_per_filler(engine_for):
    from blendrag.engine.caches.context import ChunkContext

    engine = engine_for("llama", context=ChunkContext())
    layout = engine.build_prompt(PREFIX, PASSAGES[:2], SUFFIX)
    passes = engine.cache.miss_passes(layout, BlendConfig(mode="reuse"))
    p = len(layout.prefix_ids)
    # the prefix; the first passage alone (exact after this very prefix); the second alone and
    # after each of the context's three fillers
    assert passes[:3] == [p, p + len(layout.chunk_ids[0]), p + len(layout.chunk_ids[1])]
    assert len(passes) == 6 and all(n > p + len(layout.chunk_ids[1]) for n in passes[3:])


def test_the_profile_measures_every_kind_of_pass(model_dir):
    engine = engine_with(model_dir, None, False)
    costs = engine.runner.costs()
    assert set(costs.kinds) == {"causal", "tail", "scattered"} and costs.layers == 3
    shape = PromptShape(800, 20, 700, 80, 200)
    assert 0 < costs.predict(BlendConfig(mode="reuse"), shape) < costs.predict(FULL, shape)
    assert engine.runner.costs() is costs  # measured once
